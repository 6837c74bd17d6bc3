"""Reads of orders: a shopper sees their own, staff see every order."""

from __future__ import annotations

import uuid

from django.db.models import Prefetch, QuerySet

from idempotency.errors import NotFound

from .models import Order, OrderLine


def order_list_for_user(*, user) -> QuerySet[Order]:
    """Return the orders `user` may read (their own; staff: all), lines prefetched."""
    orders = Order.objects.prefetch_related(
        Prefetch("lines", queryset=OrderLine.objects.order_by("position"))
    )
    if user.is_staff:
        return orders
    return orders.filter(owner=user)


def order_get_for_user(*, user, order_id) -> Order:
    """Return one order `user` may read; anyone else's order is not found (never forbidden)."""
    try:
        order_uuid = uuid.UUID(str(order_id))
    except ValueError:
        raise NotFound("No such order.") from None
    order = order_list_for_user(user=user).filter(id=order_uuid).first()
    if order is None:
        raise NotFound("No such order.")
    return order


def order_payment_summary(*, order: Order) -> dict:
    """Return the order body's `payment` member: status and amounts in the shop currency."""
    # Until the order is linked to a payment, nothing was attempted.
    return {"status": "none", "amount_captured": "0.00", "amount_refunded": "0.00"}
