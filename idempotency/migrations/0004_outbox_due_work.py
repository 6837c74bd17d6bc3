"""OutboxMessage becomes due work (core.due.DueWork): one shape for every retried row.

published_at -> done_at; a lease and needs_attention; last_error is the one
type every due row has, CharField(500) (longer texts are cut first); the due
index keeps its name and also leaves out rows that need attention.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("idempotency", "0003_inbox_message_payload"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="outboxmessage",
            name="idempotency_outbox_due_idx",
        ),
        migrations.RenameField(
            model_name="outboxmessage",
            old_name="published_at",
            new_name="done_at",
        ),
        migrations.RunSQL(
            "UPDATE idempotency_outboxmessage SET last_error = left(last_error, 499) || '…'"
            " WHERE length(last_error) > 500",
            reverse_sql=migrations.RunSQL.noop,
        ),
        migrations.AlterField(
            model_name="outboxmessage",
            name="last_error",
            field=models.CharField(blank=True, db_default="", default="", max_length=500),
        ),
        migrations.AddField(
            model_name="outboxmessage",
            name="lease_owner",
            field=models.CharField(blank=True, db_default="", default="", max_length=100),
        ),
        migrations.AddField(
            model_name="outboxmessage",
            name="lease_expires_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="outboxmessage",
            name="needs_attention",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AlterField(
            model_name="outboxmessage",
            name="attempts",
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddIndex(
            model_name="outboxmessage",
            index=models.Index(
                condition=models.Q(("done_at__isnull", True), ("needs_attention", False)),
                fields=["next_attempt_at"],
                name="idempotency_outbox_due_idx",
            ),
        ),
    ]
