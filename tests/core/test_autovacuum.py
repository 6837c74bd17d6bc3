"""The hot tables vacuum and analyze after ~1-2 % of their rows changed (migrations)."""

import pytest
from django.db import connection

from core.db import HOT_TABLE_AUTOVACUUM

HOT_TABLES = [
    "idempotency_idempotencykey",
    "idempotency_outboxmessage",
    "idempotency_delivery",
    "idempotency_inboxmessage",
    "orders_order",
]


@pytest.mark.django_db
@pytest.mark.parametrize("table", HOT_TABLES)
def test_hot_table_carries_its_autovacuum_settings(table):
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [table])
        [options] = cursor.fetchone()

    assert dict(option.split("=", 1) for option in options or []) == HOT_TABLE_AUTOVACUUM
    assert float(HOT_TABLE_AUTOVACUUM["autovacuum_vacuum_scale_factor"]) <= 0.02
