"""Placing an order's rows: the order, its lines and their `placed` events, in one statement.

`orders.services.order_hold` decides what to place; this writes it. An
order without a scope (the API's) is one INSERT statement of three common
table expressions: the order (its number and timestamps come back from
the database), its lines (their ids come back) and the event rows, the
lines' events joined to the lines' ids by position. An order with a scope
is inserted first on its own so that its unique scope decides
(`services._order_insert`), then its lines and events (`placed_events`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from django.db import connection

from .models import Order, OrderEvent, OrderLine

PLACED = "placed"


def placed_events(*, order: Order, lines: Sequence[OrderLine]) -> list[OrderEvent]:
    """The `placed` event rows of a new order: the order's, then one per line (ids known)."""
    events = [OrderEvent(order=order, kind=PLACED, from_status=None, to_status=order.status)]
    events += [
        OrderEvent(
            order=order,
            line=line,
            kind=PLACED,
            from_status=None,
            to_status=line.status,
            data=_line_event_data(line),
        )
        for line in lines
    ]
    return events


def _line_event_data(line: OrderLine) -> dict:
    return {"sku": line.sku, "requested": line.quantity_requested}


def _table(model) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def order_insert_with_lines(*, order: Order, lines: Sequence[OrderLine]) -> None:
    """Insert a new order without a scope, its lines and its `placed` events: one statement.

    Sets what the database made: the order's `number`, `created_at` and
    `updated_at`, each line's `id`. The caller's transaction holds it all.
    """
    assert order.scope is None, "an order with a scope is inserted on its own first"
    line_values = ", ".join(
        [
            "(%s::uuid, %s::integer, %s::uuid, %s, %s::numeric, %s::integer, %s::integer,"
            " 0, 0, %s, %s::uuid)"
        ]
        * len(lines)
    )
    event_values = ", ".join(["(%s::integer, %s, %s::jsonb)"] * len(lines))
    sql = (
        f"WITH placed AS (INSERT INTO {_table(Order)} (id, owner_id, status, fulfillment,"
        "  on_shortage, payment_method, shipping_address, currency, total,"
        "  reservation_expires_at, payment_id, language, scope)"
        "  VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s::uuid, %s, NULL)"
        "  RETURNING number, created_at, updated_at),"
        f" lines AS (INSERT INTO {_table(OrderLine)} (order_id, position, product_id, sku,"
        "  unit_price, quantity_requested, quantity_confirmed, quantity_shipped,"
        f"  quantity_returned, status, reservation_id) VALUES {line_values}"
        "  RETURNING id, position),"
        f" events AS (INSERT INTO {_table(OrderEvent)}"
        "  (order_id, line_id, kind, from_status, to_status, data)"
        "  SELECT %s::uuid, NULL::bigint, %s, NULL, %s, '{}'::jsonb"
        "  UNION ALL SELECT %s::uuid, lines.id, %s, NULL, e.status, e.data FROM lines"
        f"  JOIN (VALUES {event_values}) AS e(position, status, data)"
        "  ON e.position = lines.position)"
        " SELECT number, created_at, updated_at,"
        "  ARRAY(SELECT id FROM lines ORDER BY position) FROM placed"
    )
    params: list = [
        order.id,
        order.owner_id,
        order.status,
        order.fulfillment,
        order.on_shortage,
        order.payment_method,
        json.dumps(order.shipping_address),
        order.currency,
        order.total,
        order.reservation_expires_at,
        order.payment_id,
        order.language,
    ]
    for line in lines:
        params += [
            order.id,
            line.position,
            line.product_id,
            line.sku,
            line.unit_price,
            line.quantity_requested,
            line.quantity_confirmed,
            line.status,
            line.reservation_id,
        ]
    params += [order.id, PLACED, order.status, order.id, PLACED]
    for line in lines:
        params += [line.position, line.status, json.dumps(_line_event_data(line))]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        order.number, order.created_at, order.updated_at, line_ids = cursor.fetchone()
    order._state.adding = False
    for line, line_id in zip(sorted(lines, key=lambda line: line.position), line_ids, strict=True):
        line.id = line_id
        line._state.adding = False
