"""Checkout statements whose generic plan reads by the right index, so a prepared
statement is planned once per connection, not on every call (docs/performance.md,
"Prepared statements").

PostgreSQL plans a prepared statement's first five runs for their values, then
keeps one plan for any values (the generic plan) unless that plan costs more than
the value-specific ones; then it plans every call again. A generic plan cannot
use a partial index whose condition it cannot prove from bound values, and
guesses ten elements for a bound array.
"""

import json
import re

import pytest
from django.db import connection
from psycopg import sql as psql

from orders.limits import RATE_PERIOD, owner_orders_sql
from orders.models import OrderLine
from orders.states import LineStatus, OrderStatus
from orders.transitions import order_transition

pytestmark = pytest.mark.django_db


def _generic_plan(sql: str, params) -> list[dict]:
    """The scans of the generic plan of `sql` prepared with `params` (psycopg's placeholders).

    psycopg prepares it on the server (or has already), its parameter types
    those of `params`; the plan is EXPLAIN EXECUTE of that statement under
    `force_generic_plan`.
    """
    raw = connection.connection
    with raw.cursor() as cursor:
        cursor.execute(sql, params, prepare=True)
        cursor.execute(
            "SELECT name FROM pg_prepared_statements WHERE statement = %s", [_numbered(sql)]
        )
        [(name,)] = cursor.fetchall()
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        literals = psql.SQL(", ").join(map(psql.Literal, _ordered(sql, params)))
        cursor.execute(
            psql.SQL("EXPLAIN (FORMAT JSON) EXECUTE {}({})").format(psql.Identifier(name), literals)
        )
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    scans, todo = [], [plan[0]["Plan"]]
    while todo:
        node = todo.pop()
        if "Relation Name" in node:
            scans.append(node)
        todo += node.get("Plans", [])
    return scans


def _names(sql: str) -> list[str]:
    return list(dict.fromkeys(re.findall(r"%\((\w+)\)s", sql)))


def _numbered(sql: str) -> str:
    """`sql` as psycopg sends it: $n placeholders (a name keeps its first number)."""
    names, count = _names(sql), iter(range(1, sql.count("%s") + 1))
    sql = re.sub(r"%\((\w+)\)s", lambda match: f"${names.index(match.group(1)) + 1}", sql)
    return re.sub(r"%s", lambda match: f"${next(count)}", sql).replace("%%", "%")


def _ordered(sql: str, params) -> list:
    """`params` in the order of their $n."""
    return [params[name] for name in _names(sql)] if isinstance(params, dict) else list(params)


def _index_names(scans: list[dict], relation: str) -> set:
    return {scan.get("Index Name") for scan in scans if scan["Relation Name"] == relation}


def test_the_limits_read_has_a_generic_plan_on_the_holding_index(make_user):
    owner = make_user()
    params = {"owner": owner.pk, "period": float(RATE_PERIOD), "rate": 20, "most": 3}
    scans = _generic_plan(owner_orders_sql(), params)
    assert "orders_order_owner_holding_idx" in _index_names(scans, "orders_order")
    # The wrong twin: the statuses bound as an array; no generic plan can use the index.
    bound = owner_orders_sql().replace(
        "status IN ('awaiting_decision', 'payment_pending')", "status = ANY(%(holding)s)"
    )
    assert bound != owner_orders_sql()
    twin = _generic_plan(bound, {**params, "holding": ["awaiting_decision", "payment_pending"]})
    assert "orders_order_owner_holding_idx" not in _index_names(twin, "orders_order")


def test_the_order_transition_reads_its_lines_by_the_order_in_the_generic_plan(
    reserve, make_product
):
    make_product("TEE-M", price="19.99", stock=5)
    make_product("TEE-L", price="19.99", stock=5)
    order = reserve({"TEE-M": 1, "TEE-L": 1})
    lines = list(OrderLine.objects.filter(order_id=order.id))
    statements: list = []

    def capture(execute, sql, params, many, context):
        if sql.startswith("WITH moved AS"):
            statements.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        order_transition(
            order=order,
            source=order.status,
            target=OrderStatus.CONFIRMED,
            kind="confirmed",
            lines=lines,
            line_source=LineStatus.RESERVED,
            line_target=LineStatus.CONFIRMED,
        )
    [(sql, params)] = statements
    indexes = _index_names(_generic_plan(sql, params), "orders_orderline")
    assert any(name and "order_id" in name for name in indexes), indexes
    # The wrong twin: the lines by their ids alone, the order's id dropped.
    twin_sql = sql.replace("WHERE order_id = %s AND id = ANY", "WHERE id = ANY")
    assert twin_sql != sql
    twin_params = list(params)
    del twin_params[4]
    twin = _index_names(_generic_plan(twin_sql, twin_params), "orders_orderline")
    assert not any(name and "order_id" in name for name in twin), twin
