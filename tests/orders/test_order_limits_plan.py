"""The limits' read stops at the window, however long the shopper's history
(orders/limits.py, `owner_orders_sql`; docs/checkout.md, "Limits per shopper").

A rate set high (the bench sets 100,000,000) once made every checkout read the
shopper's newest `rate` orders, all of a long history; the read now walks
`orders_order_owner_created_idx` from the window's start.
"""

import json

import pytest
from django.db import connection

from orders.limits import RATE_PERIOD, owner_orders_sql

pytestmark = pytest.mark.django_db

HISTORY = 3000  # the shopper's orders, all older than the window
RATE = 100_000_000

# The wrong twin: the shopper's newest `rate` orders by number, filtered by age in Python.
NEWEST_BY_NUMBER = (
    "SELECT created_at FROM orders_order WHERE owner_id = %(owner)s"
    " ORDER BY number DESC LIMIT %(rate)s"
)


@pytest.fixture
def long_history(make_user):
    owner = make_user()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO orders_order (id, owner_id, status, fulfillment, on_shortage,"
            " payment_method, shipping_address, currency, total, created_at, updated_at)"
            " SELECT gen_random_uuid(), %s, 'confirmed', 'unfulfilled', 'reject', 'card',"
            " '{}'::jsonb, 'EUR', 10, now() - interval '2 days' + g * interval '1 second',"
            " now() FROM generate_series(1, %s) g",
            [owner.pk, HISTORY],
        )
        cursor.execute("ANALYZE orders_order")
    return owner


def _rows_read(sql: str, params: dict) -> int:
    """The most rows any scan of orders_order returned, from EXPLAIN ANALYZE."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    most, todo = 0, [plan[0]["Plan"]]
    while todo:
        node = todo.pop()
        if node.get("Relation Name") == "orders_order":
            most = max(most, node["Actual Rows"] * node.get("Actual Loops", 1))
        todo += node.get("Plans", [])
    return most


def test_the_limits_read_nothing_of_a_history_older_than_the_window(long_history):
    params = {
        "owner": long_history.pk,
        "period": float(RATE_PERIOD),
        "rate": RATE,
        "most": RATE,
    }
    with connection.cursor() as cursor:
        cursor.execute(owner_orders_sql(), params)
        _, in_window, oldest, holding = cursor.fetchone()
    assert (in_window, oldest, holding) == (0, None, [])
    assert _rows_read(owner_orders_sql(), params) == 0
    # The twin reads the whole history to find the same nothing.
    assert _rows_read(NEWEST_BY_NUMBER, params) == HISTORY
