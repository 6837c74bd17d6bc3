"""An order's state changes: the one conditional transition, its event rows, its event payload.

Used by checkout (`orders.services`) and by compensation
(`orders.compensation`); it imports neither, so neither imports the other
for it (tests/test_layout.py finds import cycles).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from django.db import connection
from django.db.models import F, Q
from django.db.models.functions import Now

from core.money import format_money

from .models import Order, OrderEvent, OrderLine
from .states import LINE_TRANSITIONS, ORDER_TRANSITIONS, OrderStatus, check_transition


def order_transition(
    *,
    order: Order,
    source: str,
    target: str,
    kind: str,
    condition: Q | None = None,
    lines: Sequence[OrderLine] | None = None,
    line_source: str | None = None,
    line_target: str | None = None,
) -> list[OrderLine] | None:
    """Move `order` from `source` to `target` if it is still in `source`, and its lines with it.

    Lines in `line_source` move to `line_target`. One event row per change,
    all in one INSERT. Return the lines moved, or None (nothing changed)
    when another transaction moved the order first. Only the transaction
    that wins the order's conditional UPDATE touches its lines, so lines
    read before it (or after it) cannot change under it.
    """
    check_transition(ORDER_TRANSITIONS, source, target)
    if condition is None and (line_source is None or lines is not None):
        return _transition_in_one_statement(
            order=order,
            source=source,
            target=target,
            kind=kind,
            lines=lines or [],
            line_source=line_source,
            line_target=line_target,
        )
    moved = Order.objects.filter(condition or Q(), id=order.id, status=source).update(
        status=target, updated_at=Now()
    )
    if not moved:
        return None
    order.status = target
    events = [OrderEvent(order_id=order.id, kind=kind, from_status=source, to_status=target)]
    moving: list[OrderLine] = []
    if line_source is not None:
        assert line_target is not None  # lines move only with a target
        check_transition(LINE_TRANSITIONS, line_source, line_target)
        if lines is None:
            lines = list(OrderLine.objects.filter(order_id=order.id).order_by("position"))
        moving = [line for line in lines if line.status == line_source]
        if moving:
            OrderLine.objects.filter(
                id__in=[line.id for line in moving], status=line_source
            ).update(status=line_target)
        for line in moving:
            line.status = line_target
            events.append(
                OrderEvent(
                    order_id=order.id,
                    line_id=line.id,
                    kind=kind,
                    from_status=line_source,
                    to_status=line_target,
                    data={"sku": line.sku},
                )
            )
    OrderEvent.objects.bulk_create(events)
    return moving


def _transition_in_one_statement(
    *,
    order: Order,
    source: str,
    target: str,
    kind: str,
    lines: Sequence[OrderLine],
    line_source: str | None,
    line_target: str | None,
) -> list[OrderLine] | None:
    """`order_transition` without a condition, its lines given: one statement.

    The order's conditional UPDATE, the lines' UPDATE and the event rows'
    INSERT, the last two written only when the first moved the order (each
    reads it, so the order row is locked before its lines). The lines are
    found by their order first: a prepared statement's generic plan then reads
    the order's few lines by its index, whatever the length of the id array,
    so PostgreSQL need not plan the statement on every call
    (docs/performance.md, "Prepared statements").
    """
    moving: list[OrderLine] = []
    if line_source is not None:
        assert line_target is not None  # lines move only with a target
        check_transition(LINE_TRANSITIONS, line_source, line_target)
        moving = [line for line in lines if line.status == line_source]
    events: list[tuple] = [(order.id, None, kind, source, target, "{}")]
    events += [
        (order.id, line.id, kind, line_source, line_target, json.dumps({"sku": line.sku}))
        for line in moving
    ]
    values = ", ".join(["(%s::uuid, %s::bigint, %s, %s, %s, %s::jsonb)"] * len(events))
    sql = (
        f"WITH moved AS (UPDATE {_table(Order)} SET status = %s,"
        "  updated_at = statement_timestamp() WHERE id = %s AND status = %s RETURNING id),"
        f" moved_lines AS (UPDATE {_table(OrderLine)} SET status = %s"
        "  WHERE order_id = %s AND id = ANY(%s::bigint[]) AND status = %s"
        "  AND EXISTS (SELECT 1 FROM moved)),"
        f" events AS (INSERT INTO {_table(OrderEvent)}"
        "  (order_id, line_id, kind, from_status, to_status, data)"
        f"  SELECT * FROM (VALUES {values}) AS e WHERE EXISTS (SELECT 1 FROM moved))"
        " SELECT count(*) FROM moved"
    )
    params: list = [target, order.id, source, line_target, order.id, [line.id for line in moving]]
    params.append(line_source)
    for event in events:
        params += event
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        (moved,) = cursor.fetchone()
    if not moved:
        return None
    order.status = target
    if line_target is not None:
        for line in moving:
            line.status = line_target
    return moving


def _table(model) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def order_event_payload(*, order: Order, lines: Sequence[OrderLine] | None = None) -> dict:
    """The payload of the order's outbox events (docs/events.md)."""
    if lines is None:
        lines = list(OrderLine.objects.filter(order_id=order.id).order_by("position"))
    return {
        "order_id": str(order.id),
        "number": order.number,
        "owner_id": order.owner_id,
        "status": order.status,
        "total": format_money(order.total),
        "currency": order.currency,
        "lines": [
            {
                "sku": line.sku,
                "quantity_requested": line.quantity_requested,
                "quantity_confirmed": line.quantity_confirmed,
                "unit_price": format_money(line.unit_price),
                "status": line.status,
            }
            for line in lines
        ],
    }


def order_cancel_complete(*, order_id) -> bool:
    """`cancelling` → `cancelled` once every cancellation step is done, and only when the
    payment refunded everything it captured (or there is none).

    The caller holds the payment's row lock, then the order's
    (`lock_objects.order_and_payment_lock`); the condition is part of the
    transition's conditional UPDATE, so `cancelled` is written only when
    `amount_refunded = amount_captured` holds in that transaction
    (docs/compensation.md, "One refund budget").
    """
    return (
        order_transition(
            order=Order(id=order_id),
            source=OrderStatus.CANCELLING,
            target=OrderStatus.CANCELLED,
            kind="cancelled",
            condition=Q(payment__isnull=True)
            | Q(payment__amount_refunded=F("payment__amount_captured")),
        )
        is not None
    )
