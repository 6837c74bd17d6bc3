"""A request key is leased, not locked (docs/glossary.md): locked_by/locked_at -> leased_by/leased_at."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("idempotency", "0006_delivery"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="idempotencykey", name="idempotency_idempotencykey_lock_complete"
        ),
        migrations.RemoveConstraint(
            model_name="idempotencykey", name="idempotency_idempotencykey_finished_has_answer"
        ),
        migrations.RenameField(
            model_name="idempotencykey", old_name="locked_by", new_name="leased_by"
        ),
        migrations.RenameField(
            model_name="idempotencykey", old_name="locked_at", new_name="leased_at"
        ),
        migrations.AddConstraint(
            model_name="idempotencykey",
            constraint=models.CheckConstraint(
                condition=models.Q(("leased_at__isnull", True), ("leased_by__isnull", True))
                | models.Q(("leased_at__isnull", False), ("leased_by__isnull", False)),
                name="idempotency_idempotencykey_lease_complete",
            ),
        ),
        migrations.AddConstraint(
            model_name="idempotencykey",
            constraint=models.CheckConstraint(
                condition=models.Q(models.Q(("recovery_point", "finished"), _negated=True))
                | models.Q(
                    ("finished_at__isnull", False),
                    ("leased_by__isnull", True),
                    ("response_status__isnull", False),
                ),
                name="idempotency_idempotencykey_finished_has_answer",
            ),
        ),
    ]
