from django.db import migrations

from core.db import hot_table_autovacuum


class Migration(migrations.Migration):
    """Autovacuum after ~1 % of the orders changed (every order is updated a few times)."""

    dependencies = [("orders", "0005_order_refund_permission")]

    operations = [hot_table_autovacuum("orders_order")]
