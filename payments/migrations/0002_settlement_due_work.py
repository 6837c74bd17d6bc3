"""PaymentSettlement becomes due work (core.due.DueWork): one shape for every retried row.

settled_at -> done_at, claimed_until -> lease_expires_at, plus lease_owner;
the due index keeps its name with the renamed column in its condition.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("payments", "0001_initial"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="paymentsettlement",
            name="payments_settlement_due_idx",
        ),
        migrations.RenameField(
            model_name="paymentsettlement",
            old_name="settled_at",
            new_name="done_at",
        ),
        migrations.RenameField(
            model_name="paymentsettlement",
            old_name="claimed_until",
            new_name="lease_expires_at",
        ),
        migrations.AddField(
            model_name="paymentsettlement",
            name="lease_owner",
            field=models.CharField(blank=True, db_default="", default="", max_length=100),
        ),
        migrations.AlterField(
            model_name="paymentsettlement",
            name="attempts",
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AlterField(
            model_name="paymentsettlement",
            name="last_error",
            field=models.CharField(blank=True, db_default="", default="", max_length=500),
        ),
        migrations.AlterField(
            model_name="paymentsettlement",
            name="needs_attention",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddIndex(
            model_name="paymentsettlement",
            index=models.Index(
                condition=models.Q(("done_at__isnull", True), ("needs_attention", False)),
                fields=["next_attempt_at"],
                name="payments_settlement_due_idx",
            ),
        ),
    ]
