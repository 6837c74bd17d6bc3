"""Give the orders placed from a cart before `Order.scope` existed their scope.

An order still in flight (awaiting the decision, payment pending) moves its
cart when it is kept or ended only if it carries its cart version
(docs/checkout.md, "One order per cart version"). Its checkout key is still
there (an open key is never purged; an undecided order's key lives longer
than its reservation), and names the version: `checkout:<cart>:<version>`
with the order's id in its data. One key per (owner, key), so one order per
scope. Older orders whose keys are gone keep no scope: they are decided.
"""

from django.db import migrations

BACKFILL = r"""
UPDATE orders_order AS o
   SET scope = 'cart:' || split_part(k.key, ':', 2) || ':' || split_part(k.key, ':', 3)
  FROM idempotency_idempotencykey AS k
 WHERE k.operation = 'shop.order.create'
   AND k.key ~ '^checkout:[0-9]+:[0-9]+$'
   AND k.data ->> 'order_id' ~ '^[0-9a-f-]{36}$'
   AND o.id = (k.data ->> 'order_id')::uuid
   AND o.owner_id = k.owner_id
   AND o.scope IS NULL
"""


class Migration(migrations.Migration):
    dependencies = [
        ("shop", "0004_mail"),
        ("orders", "0008_order_scope"),
        ("idempotency", "0008_hot_table_autovacuum"),
    ]

    operations = [migrations.RunSQL(BACKFILL, reverse_sql=migrations.RunSQL.noop)]
