"""Reads of orders: a shopper sees their own, staff see every order."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import Count, F, Prefetch, Q, QuerySet, Sum

from core import attention
from core.errors import ApplicationError, NotFound

from .models import (
    CompensationStep,
    Order,
    OrderEvent,
    OrderLine,
    ReturnLine,
    ReturnRequest,
    Shipment,
    ShipmentLine,
)
from .states import CompensationKind, OrderStatus, StepStatus

# Orders read for an answer carry their lines, in position order, as this
# plain attribute (a `to_attr` prefetch); the order body reads it.
LINES_ATTR = "line_list"


def _orders() -> QuerySet[Order]:
    return Order.objects.select_related("payment").prefetch_related(
        Prefetch("lines", queryset=OrderLine.objects.order_by("position"), to_attr=LINES_ATTR)
    )


def order_get(*, order_id) -> Order:
    """Return one order with its lines and payment (no permission check: services' use)."""
    return _orders().get(id=order_id)


def order_of_scope(*, owner_id: int, scope: str) -> tuple[uuid.UUID, str] | None:
    """The (id, status) of the owner's order placed from a business scope, or None."""
    return Order.objects.filter(owner_id=owner_id, scope=scope).values_list("id", "status").first()


def order_languages(*, numbers) -> dict[int, str]:
    """The language each order was placed in, by order number (unknown numbers left out)."""
    wanted = {int(n) for n in numbers}
    if not wanted:
        return {}
    return dict(Order.objects.filter(number__in=wanted).values_list("number", "language"))


def order_with_lines(*, order: Order, lines: list[OrderLine]) -> Order:
    """Give `order` the lines just read and changed in this transaction, as if prefetched.

    Spares the answer of a transition a second read of rows that are current
    in memory (`order.payment` must be current too). `order_is_loaded` says
    whether an order carries them.
    """
    setattr(order, LINES_ATTR, sorted(lines, key=lambda line: line.position))
    return order


def order_is_loaded(order: Order) -> bool:
    """Return True if `order` carries its lines (prefetched or attached) and its payment."""
    return hasattr(order, LINES_ATTR) and (
        order.payment_id is None or Order.payment.is_cached(order)
    )


def order_list_for_user(*, user) -> QuerySet[Order]:
    """Return the orders `user` may read (their own; staff: all), lines prefetched."""
    orders = _orders()
    if user.is_staff:
        return orders
    return orders.filter(owner=user)


def order_keys_for_user(*, user) -> QuerySet[Order]:
    """Return the ids and numbers of the orders `user` may read: what the list pages over.

    Only `id` and `number`, so a shopper's page is an index-only scan of
    `orders_order_owner_number_idx` (owner, number DESC, INCLUDE id) whatever
    the planner estimates; selecting whole rows let it prefer a backward scan
    of the number index filtered by owner, which reads every newer order of
    every shopper before reaching an old one. `orders_in_page` reads the page.
    """
    orders = Order.objects.only("id", "number")
    return orders if user.is_staff else orders.filter(owner=user)


def orders_in_page(*, keys: list[Order]) -> list[Order]:
    """Return the orders of a page of `order_keys_for_user`, in its order, lines prefetched."""
    found = {order.id: order for order in _orders().filter(id__in=[key.id for key in keys])}
    return [found[key.id] for key in keys if key.id in found]


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


def order_get_for_owner_decision(*, user, order_id) -> Order:
    """Return an order only its shopper may decide on (confirm: say yes and be charged).

    Whoever may not read the order gets 404, as for any read. Staff may read
    it, so a 404 would contradict their GET and hide nothing: they get 403
    `permission_denied`, which tells them only what the order body already
    does (who owns it). Raised before the request key is claimed, like the 404.
    """
    order = order_get_for_user(user=user, order_id=order_id)
    if order.owner_id != user.pk:
        raise ApplicationError(
            "Only the order's shopper can confirm it.", status=403, code="permission_denied"
        )
    return order


@dataclass(frozen=True)
class PaymentSummary:
    """An order's payment as its readers show it: "none" and zeros before any payment."""

    status: str
    amount_captured: Decimal
    amount_refunded: Decimal


def order_payment_summary(*, order: Order) -> PaymentSummary:
    """Return the order's payment status and amounts (the order body's `payment` member)."""
    payment = order.payment
    if payment is None:
        # No payment was ever asked for (awaiting a decision, or nothing to charge).
        return PaymentSummary(status="none", amount_captured=Decimal(0), amount_refunded=Decimal(0))
    return PaymentSummary(
        status=payment.status,
        amount_captured=payment.amount_captured,
        amount_refunded=payment.amount_refunded,
    )


def cancellation_steps_of(*, order_id) -> list[CompensationStep]:
    """The order's cancellation steps, by position."""
    return list(
        CompensationStep.objects.filter(
            order_id=order_id, kind=CompensationKind.CANCELLATION
        ).order_by("position")
    )


def shipment_get(*, shipment_id) -> Shipment:
    """Return one shipment with its lines (no permission check); unknown or malformed id: 404."""
    try:
        shipment_uuid = uuid.UUID(str(shipment_id))
    except ValueError:
        raise NotFound("No such shipment.") from None
    shipment = (
        Shipment.objects.select_related("order")
        .prefetch_related(
            Prefetch("lines", queryset=ShipmentLine.objects.order_by("id"), to_attr="line_list")
        )
        .filter(id=shipment_uuid)
        .first()
    )
    if shipment is None:
        raise NotFound("No such shipment.")
    return shipment


def shipment_get_for_user(*, user, shipment_id) -> Shipment:
    """Return a shipment `user` may read: of their own order (staff: any); others' are 404."""
    shipment = shipment_get(shipment_id=shipment_id)
    if not user.is_staff and shipment.order.owner_id != user.pk:
        raise NotFound("No such shipment.")
    return shipment


# -- Needs attention (the admin's list, backoffice/needs_attention.py) ----------------------


def steps_needing_attention() -> QuerySet[CompensationStep]:
    """Compensation steps waiting for staff: `failed`, or flagged and not done."""
    return CompensationStep.objects.filter(
        Q(status=StepStatus.FAILED) | Q(needs_attention=True), done_at__isnull=True
    )


def needs_attention_counts() -> dict[str, int]:
    """{kind: rows} for this app's kind of "Needs attention" (step)."""
    return {attention.STEP: steps_needing_attention().count()}


def needs_attention_items(*, limit: int = attention.PAGE_LIMIT) -> list[attention.AttentionItem]:
    """Failed compensation steps, oldest first, each with its order and return."""
    return [
        attention.AttentionItem(
            kind=attention.STEP,
            pk=str(step.pk),
            what=f"{step.kind} step {step.name} ({step.status}, {step.attempts} attempts)",
            reason=step.last_error,
            age=step.waiting,
            state=attention.row_state(step),
            status=step.status,
            order_id=step.order_id,
            return_id=step.order_return_id,
            refund_id=step.refund_id,
        )
        for step in attention.with_age(steps_needing_attention())[:limit]
    ]


def orders_for_attention(*, order_ids=(), payment_ids=()) -> tuple[dict, dict]:
    """({order id: order}, {payment id: order}) for the ids a "Needs attention" list names."""
    found = Order.objects.filter(Q(id__in=list(order_ids)) | Q(payment_id__in=list(payment_ids)))
    orders = list(found.only("id", "number", "payment_id"))
    return {o.id: o for o in orders}, {o.payment_id: o for o in orders if o.payment_id}


def returns_of_refunds(*, refund_ids) -> dict:
    """{refund id: return id} for refunds a return's refund step asked for."""
    rows = CompensationStep.objects.filter(
        refund_id__in=list(refund_ids), order_return__isnull=False
    ).values_list("refund_id", "order_return_id")
    return dict(rows)


def orders_by_status() -> dict[str, int]:
    """Orders currently in each status (every status present, 0 when none)."""
    counts = dict.fromkeys(OrderStatus.values, 0)
    for row in Order.objects.values("status").annotate(n=Count("pk")).order_by():
        counts[row["status"]] = row["n"]
    return counts


def paid_lines(*, start: datetime, end: datetime) -> QuerySet:
    """(order id, sku, units, unit price) of the confirmed lines of orders paid in [start, end)."""
    paid = OrderEvent.objects.filter(
        kind="paid",
        line__isnull=True,
        to_status__in=(OrderStatus.CONFIRMED, OrderStatus.PARTIALLY_CONFIRMED),
        created_at__gte=start,
        created_at__lt=end,
    ).values("order_id")
    return (
        OrderLine.objects.filter(order_id__in=paid, quantity_confirmed__gt=0)
        .order_by("order_id", "position")
        .values_list("order_id", "sku", "quantity_confirmed", "unit_price")
    )


def first_order_at() -> datetime | None:
    """When the first order was created (by its number: an index scan), or None."""
    return Order.objects.order_by("number").values_list("created_at", flat=True).first()


def returned_lines_by_sku(*, start: datetime, end: datetime) -> QuerySet:
    """Units and value received back in [start, end), per order and sku."""
    return (
        ReturnLine.objects.filter(
            order_return__received_at__gte=start, order_return__received_at__lt=end
        )
        .values("order_return__order_id", "sku")
        .annotate(units=Sum("quantity"), amount=Sum(F("quantity") * F("order_line__unit_price")))
        .order_by("order_return__order_id", "sku")
    )


# The storefront order page's reads: its shipments, its returns' lines and steps.


def shipments_of_order(*, order_id) -> list[Shipment]:
    """The order's shipments, oldest first."""
    return list(Shipment.objects.filter(order_id=order_id).order_by("created_at", "id"))


def return_lines_of(*, return_ids: list) -> dict:
    """{return id: [its lines, in order]} for the given returns."""
    lines: dict = {}
    for line in ReturnLine.objects.filter(order_return_id__in=return_ids).order_by("id"):
        lines.setdefault(line.order_return_id, []).append(line)
    return lines


def return_steps_of(*, return_ids: list) -> dict:
    """{return id: [its compensation steps, by position]} for the given returns."""
    steps: dict = {}
    for step in CompensationStep.objects.filter(order_return_id__in=return_ids).order_by(
        "position"
    ):
        steps.setdefault(step.order_return_id, []).append(step)
    return steps


def returns_and_units_of(*, order_id) -> tuple[int, int]:
    """(returns asked for, units in them) of one order: what changes when a return is asked."""
    returns = ReturnRequest.objects.filter(order_id=order_id)
    units = ReturnLine.objects.filter(order_return__order_id=order_id).aggregate(n=Sum("quantity"))
    return returns.count(), units["n"] or 0


def return_steps_open(*, order_return_id, names=None) -> QuerySet[CompensationStep]:
    """A return's steps not done and not waiting for staff (those named, when `names`)."""
    steps = CompensationStep.objects.filter(order_return_id=order_return_id, done_at__isnull=True)
    steps = steps.filter(needs_attention=False)
    return steps if names is None else steps.filter(name__in=names)


def return_step(*, order_return_id, name: str) -> CompensationStep:
    """One step of a return, by name."""
    return CompensationStep.objects.get(order_return_id=order_return_id, name=name)
