"""Every row lock the orders app takes explicitly, in one place.

Lock order (docs/checkout.md): the order's payment, the order row, its lines
(primary-key order), their reservation flags, then stock rows
(`inventory.lock_objects`). A shipment takes only the order row and its
lines, in that order. A cancellation's step transitions take the payment,
then the order (`order_and_payment_lock`).
"""

from __future__ import annotations

import functools

from django.contrib.auth import get_user_model
from django.db import connection

from payments.models import Payment

from .models import Order, OrderLine


def order_owner_lock(*, owner_id) -> None:
    """Lock the owner's user row until the transaction ends: one shopper's placements queue.

    Placing an order takes it first, before any stock row, and no order row.

    `orders.limits` counts the owner's orders after this lock, in the
    transaction that inserts the new order, so a second placement waiting
    here counts the first one's order once that commits (docs/checkout.md,
    "Limits per shopper"). `FOR NO KEY UPDATE`, not `FOR UPDATE`: inserting a
    row that references the user (the request key, the order) takes `FOR KEY
    SHARE` on it, which `FOR UPDATE` would wait for, so two placements that
    each inserted their request key would deadlock; `NO KEY UPDATE` lets those
    inserts pass and still makes placements of one owner wait for each other.

    Every placement takes it the same way: the statement is written once
    per process (`_owner_lock_sql`), not compiled by the ORM each time.
    """
    assert connection.in_atomic_block, "a row lock outside a transaction is released at once"
    with connection.cursor() as cursor:
        cursor.execute(_owner_lock_sql(), [owner_id])
        cursor.fetchall()


@functools.cache
def _owner_lock_sql() -> str:
    """`User.objects.select_for_update(no_key=True).filter(pk=)`'s SQL (its pk alone)."""
    user = get_user_model()._meta
    assert user.pk is not None and user.pk.column
    table, pk = connection.ops.quote_name(user.db_table), connection.ops.quote_name(user.pk.column)
    return f"SELECT {table}.{pk} FROM {table} WHERE {table}.{pk} = %s FOR NO KEY UPDATE"


def order_lock(*, order_id) -> Order:
    """Lock one order row until the transaction ends; return it as last committed."""
    assert connection.in_atomic_block, "a row lock outside a transaction is released at once"
    return Order.objects.select_for_update(of=("self",)).get(id=order_id)


def order_lines_lock(*, order_id) -> list[OrderLine]:
    """Lock an order's lines in primary-key order (after its order row); return them."""
    assert connection.in_atomic_block, "a row lock outside a transaction is released at once"
    return list(OrderLine.objects.filter(order_id=order_id).order_by("id").select_for_update())


def order_read_payment_lock(*, order_id) -> Order:
    """Lock an order's payment row (not the order's) and return the order with it, in one query.

    The same lock, in the same place of the lock order, as reading the order
    and then `payments.lock_objects.payment_lock`: the payment as last
    committed (waited for if locked), the order as read before that wait —
    as it was read before the separate lock too. An order without a payment
    (a free one) is read alone.
    """
    assert connection.in_atomic_block, "a row lock outside a transaction is released at once"
    payment = (
        Payment.objects.select_for_update(of=("self",))
        .select_related("order")
        .filter(order__id=order_id)
        .first()
    )
    if payment is None:
        return Order.objects.get(id=order_id)
    order = payment.order
    order.payment = payment
    return order


def order_and_payment_lock(*, order_id) -> Order:
    """Lock an order's payment (if it has one), then the order row; return the order with it.

    The lock order's first two places. The order is as last committed, and
    its `payment` the row as locked: a cancellation's transitions read what
    the payment refunded under the lock every refund request takes
    (docs/compensation.md, "One refund budget").
    """
    assert connection.in_atomic_block, "a row lock outside a transaction is released at once"
    payment = Payment.objects.select_for_update(of=("self",)).filter(order__id=order_id).first()
    order = order_lock(order_id=order_id)
    if payment is not None:
        order.payment = payment
    return order
