"""A flag leaving `held` is "resolved" (docs/glossary.md): settled_at -> resolved_at."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0002_reservation"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="reservation",
            name="inventory_reservation_settled_at_matches_state",
        ),
        migrations.RenameField(
            model_name="reservation",
            old_name="settled_at",
            new_name="resolved_at",
        ),
        migrations.AddConstraint(
            model_name="reservation",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("resolved_at__isnull", True), ("state", "held")),
                    models.Q(
                        models.Q(("state", "held"), _negated=True), ("resolved_at__isnull", False)
                    ),
                    _connector="OR",
                ),
                name="inventory_reservation_resolved_at_matches_state",
            ),
        ),
    ]
