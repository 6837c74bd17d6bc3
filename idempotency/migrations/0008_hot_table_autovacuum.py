from django.db import migrations

from core.db import hot_table_autovacuum


class Migration(migrations.Migration):
    """Autovacuum after ~1 % of the rows changed on the keys, outbox, deliveries and inbox."""

    dependencies = [("idempotency", "0007_key_lease_columns")]

    operations = [
        hot_table_autovacuum(
            "idempotency_idempotencykey",
            "idempotency_outboxmessage",
            "idempotency_delivery",
            "idempotency_inboxmessage",
        )
    ]
