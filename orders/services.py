"""Writes to orders: placing (reserving), deciding, paying, cancelling, expiring.

Every status change is a conditional UPDATE naming the source status (see
`orders.states`), so two processes racing for the same order (confirm vs
expiry, a retry vs the completer, settlement vs the request) cannot both
win: the loser's UPDATE matches no row and it does nothing. The winner
changes the lines, the reservation flags and the event rows in the same
transaction.

Lock order, everywhere: the order's payment row (only where a payment
outcome is applied: `order_payment_apply`, and settlement, which calls
`order_payment_settled` with the payment locked), the order row, its lines,
their reservation flags, then stock rows in primary-key order
(`inventory.lock_objects`). Anything that will later lock a payment after
an order (compensation) must take the payment first, too.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils.module_loading import import_string
from django.utils.translation import gettext as _

from core.db import database_now, insert_first
from core.errors import ApplicationError, InvalidState
from core.money import format_money, minor_units
from idempotency.failpoints import failpoint
from idempotency.messaging.outbox import outbox_write
from inventory import services as inventory_services
from payments.capture import PreparedCapture, payment_create, payment_prepare
from payments.gateway import Outcome
from payments.states import PaymentStatus

from . import compensation, limits, lock_objects, placement, selectors
from .event_types import OrderEventType
from .models import SCOPE_CONSTRAINT, Order, OrderEvent, OrderLine
from .states import (
    LINE_TRANSITIONS,
    ORDER_TRANSITIONS,
    CompensationKind,
    Fulfillment,
    LineStatus,
    OnShortage,
    OrderStatus,
    check_transition,
)
from .transitions import order_event_payload, order_transition

if TYPE_CHECKING:  # annotations only: other apps' rows are read through their selectors
    from inventory.models import Product
    from payments.models import Payment


class InsufficientStock(ApplicationError):
    status = 409
    code = "insufficient_stock"
    title = "Insufficient stock"


class PriceChanged(ApplicationError):
    status = 409
    code = "price_changed"
    title = "Price changed"


class ReservationExpired(ApplicationError):
    status = 409
    code = "reservation_expired"
    title = "Reservation expired"


class PaymentPending(ApplicationError):
    status = 409
    code = "payment_pending"
    title = "Payment pending"


class OrderShipped(ApplicationError):
    status = 409
    code = "order_shipped"
    title = "Order shipped"


class PaymentDeclined(ApplicationError):
    status = 402
    code = "payment_declined"
    title = "Payment declined"


class AlreadyOrdered(ApplicationError):
    """The scope (a cart version) already has its order: `extra["order_id"]` names it."""

    status = 409
    code = "already_ordered"
    title = "Already ordered"


@dataclass(frozen=True)
class LineRequest:
    """One validated line of a new order: the product (with its stock) and the units wanted."""

    product: Product
    quantity: int


def _quantize(amount: Decimal) -> Decimal:
    return amount.quantize(Decimal(1).scaleb(-minor_units()))


def _reservation_ids(lines: Iterable[OrderLine]) -> list:
    return [line.reservation_id for line in lines if line.reservation_id is not None]


def _publish(
    *, order: Order, event_type: OrderEventType, lines: Sequence[OrderLine] | None = None
) -> None:
    """Write the order's event to the outbox, in the transaction that made it true."""
    outbox_write(
        aggregate_type="order",
        aggregate_id=str(order.id),
        event_type=event_type,
        payload=order_event_payload(order=order, lines=lines),
    )


def _scope_follows(*, order: Order, kept: bool, lines: Sequence[OrderLine] | None = None) -> None:
    """Tell the place an order was placed from (its scope) that the order is kept or ended.

    Called in the transaction whose conditional UPDATE decided it, so once per
    order: `settings.ORDERS_SCOPE_HANDLER(scope=, kept=, ordered={sku: quantity
    requested})` (the storefront's cart, shop.cart.cart_order_decided). An
    order without a scope (the API's) has no one to tell.
    """
    path = settings.ORDERS_SCOPE_HANDLER
    if order.scope is None or not path:
        return
    if lines is None:
        lines = list(OrderLine.objects.filter(order_id=order.id))
    ordered = {line.sku: line.quantity_requested for line in lines}
    import_string(path)(scope=order.scope, kept=kept, ordered=ordered)


def _order_insert(order: Order) -> None:
    """Insert a new order; one with a scope another order has is `AlreadyOrdered`.

    Insert first: the unique scope (`orders_order_scope_uniq`) decides, in a
    savepoint so the answer can name the order that has it (committed: a
    concurrent insert of the same scope waits for the first to end).
    """
    if order.scope is None:
        order.save(force_insert=True)
        return
    if not insert_first(order, constraint=SCOPE_CONSTRAINT):
        existing = Order.objects.values_list("id", flat=True).get(scope=order.scope)
        raise AlreadyOrdered(_("This cart was already ordered."), extra={"order_id": str(existing)})


@transaction.atomic
def order_hold(
    *,
    owner,
    lines: Sequence[LineRequest],
    on_shortage: str,
    payment_method: str,
    shipping_address: dict,
    expected_total: Decimal | None = None,
    scope: str | None = None,
    language: str | None = None,
    payment_id: uuid.UUID | None = None,
) -> Order:
    """Hold stock for every line and create the order, or refuse with nothing held.

    Each line gets a reservation flag for min(requested, available) units.
    Every line fully held → `payment_pending` (the caller takes the payment).
    Nothing held at all → 409 `insufficient_stock` in every mode. Otherwise
    by `on_shortage`: `reject` → 409 `insufficient_stock`; `partial` →
    `payment_pending` for what is held (fully short lines `unavailable`);
    `ask` → `awaiting_decision` until `reservation_expires_at`.
    A refusal raises, so this transaction (savepoint) rolls back and every
    flag and counter change with it. `scope` names the business scope the
    order is placed from (the storefront's cart version): a scope that already
    has an order, whatever became of it, is 409 `already_ordered` naming it.
    `language` is the one the order is placed in (its e-mails'), else LANGUAGE_CODE.
    The order carries `held_lines`: its lines as inserted. `payment_id`: the
    id its payment gets in this transaction (`order_payment_prepare`), written
    with a `payment_pending` order that has something to charge (the foreign
    key is checked at commit), so the order needs no second write for it.
    """
    skus = [line.product.sku for line in lines]
    assert lines and len(set(skus)) == len(skus), "lines must be non-empty with distinct skus"
    # Past the owner's limits per shopper: 429 `throttled` before anything is held.
    limits.order_limits_check(owner_id=owner.pk)
    requested_total = _quantize(
        sum((line.product.price * line.quantity for line in lines), Decimal(0))
    )
    if expected_total is not None and expected_total != requested_total:
        raise PriceChanged(
            _("The total is now {total}, not {expected}.").format(
                total=format_money(requested_total), expected=format_money(expected_total)
            ),
            errors={
                "expected_total": [
                    _("The current total is {total}.").format(total=format_money(requested_total))
                ]
            },
            extra={"total": format_money(requested_total), "currency": settings.SHOP_CURRENCY},
        )

    held = inventory_services.reservations_hold(
        requests={line.product.stock.id: line.quantity for line in lines}, partial=True
    )
    granted = [
        held[line.product.stock.id].quantity if line.product.stock.id in held else 0
        for line in lines
    ]
    short = [
        {"index": index, "sku": line.product.sku, "requested": line.quantity, "available": units}
        for index, (line, units) in enumerate(zip(lines, granted, strict=True))
        if units < line.quantity
    ]
    if not any(granted):
        raise InsufficientStock(_("No unit of any line is available."), errors={"lines": short})
    if short and on_shortage == OnShortage.REJECT:
        raise InsufficientStock(
            _("Not every line is available in the quantity requested."), errors={"lines": short}
        )

    expires_at = None
    status = OrderStatus.PAYMENT_PENDING
    if short and on_shortage == OnShortage.ASK:
        status = OrderStatus.AWAITING_DECISION
        expires_at = database_now() + timedelta(seconds=settings.ORDER_RESERVATION_TTL_SECONDS)
        inventory_services.reservations_set_expiry(
            reservation_ids=[reservation.id for reservation in held.values()],
            expires_at=expires_at,
        )

    total = _quantize(
        sum(
            (line.product.price * units for line, units in zip(lines, granted, strict=True)),
            Decimal(0),
        )
    )
    order = Order(
        owner=owner,
        status=status,
        fulfillment=Fulfillment.UNFULFILLED,
        on_shortage=on_shortage,
        payment_method=payment_method,
        shipping_address=shipping_address,
        currency=settings.SHOP_CURRENCY,
        total=total,
        reservation_expires_at=expires_at,
        scope=scope,
        language=language or settings.LANGUAGE_CODE,
        payment_id=payment_id if status == OrderStatus.PAYMENT_PENDING and total else None,
    )
    order_lines = [
        OrderLine(
            order=order,
            position=index,
            product=line.product,
            sku=line.product.sku,
            unit_price=line.product.price,
            quantity_requested=line.quantity,
            quantity_confirmed=units,
            status=LineStatus.RESERVED if units else LineStatus.UNAVAILABLE,
            reservation=held.get(line.product.stock.id),
        )
        for index, (line, units) in enumerate(zip(lines, granted, strict=True))
    ]
    check_transition(ORDER_TRANSITIONS, None, status)
    for order_line in order_lines:
        check_transition(LINE_TRANSITIONS, None, order_line.status)
    if scope is None:
        placement.order_insert_with_lines(order=order, lines=order_lines)
    else:
        _order_insert(order)
        OrderLine.objects.bulk_create(order_lines)
        OrderEvent.objects.bulk_create(placement.placed_events(order=order, lines=order_lines))
    order.held_lines = order_lines
    return order


def _payment_record(
    *, order: Order, succeeded: bool, lines: list[OrderLine] | None = None
) -> Order:
    if lines is None:
        lines = list(OrderLine.objects.filter(order_id=order.id).order_by("position"))
    if succeeded:
        partial = any(line.quantity_confirmed < line.quantity_requested for line in lines)
        target, event_type = (
            (OrderStatus.PARTIALLY_CONFIRMED, OrderEventType.PARTIALLY_CONFIRMED)
            if partial
            else (OrderStatus.CONFIRMED, OrderEventType.CONFIRMED)
        )
        moved = order_transition(
            order=order,
            source=OrderStatus.PAYMENT_PENDING,
            target=target,
            kind="paid",
            lines=lines,
            line_source=LineStatus.RESERVED,
            line_target=LineStatus.CONFIRMED,
        )
        if moved is not None:
            inventory_services.reservations_commit(reservation_ids=_reservation_ids(moved))
            _publish(order=order, lines=lines, event_type=event_type)
            _scope_follows(order=order, kept=True, lines=lines)
            selectors.order_with_lines(order=order, lines=lines)
        return order
    moved = order_transition(
        order=order,
        source=OrderStatus.PAYMENT_PENDING,
        target=OrderStatus.PAYMENT_FAILED,
        kind="payment_failed",
        lines=lines,
        line_source=LineStatus.RESERVED,
        line_target=LineStatus.RELEASED,
    )
    if moved is not None:
        inventory_services.reservations_release(reservation_ids=_reservation_ids(moved))
        _publish(order=order, lines=lines, event_type=OrderEventType.PAYMENT_FAILED)
        _scope_follows(order=order, kept=False, lines=lines)
        selectors.order_with_lines(order=order, lines=lines)
    return order


@transaction.atomic(savepoint=False)
def order_payment_record(*, order_id, succeeded: bool) -> Order:
    """Apply the payment's final outcome to a `payment_pending` order; harmless twice.

    Succeeded → `confirmed` (or `partially_confirmed` when a line got fewer
    units than requested) and the flags committed (units sold). Declined →
    `payment_failed` and the flags released. An order that already left
    `payment_pending` is returned unchanged. (No savepoint: the caller's
    transaction is all or nothing with it.)
    """
    return _payment_record(order=Order.objects.get(id=order_id), succeeded=succeeded)


@transaction.atomic(savepoint=False)
def order_payment_start(*, order: Order) -> Order:
    """Create the payment of a `payment_pending` order (inside the phase that decided it).

    Its reference is `order-<number>`, from which the provider key is derived,
    so every capture attempt for this order is the same charge. An order
    whose total is zero (free articles) has nothing to charge: it is
    confirmed at once.
    """
    assert order.status == OrderStatus.PAYMENT_PENDING, order.status
    if order.total == 0:
        return _payment_record(order=order, succeeded=True)
    payment = payment_create(
        reference=f"order-{order.number}",
        amount=order.total,
        currency=order.currency,
        payment_method=order.payment_method,
        owner=order.owner,
    )
    Order.objects.filter(id=order.id, payment__isnull=True).update(payment=payment)
    order.payment = payment
    return order


@transaction.atomic(savepoint=False)
def order_payment_prepare(*, order: Order) -> PreparedCapture | None:
    """Create the payment of a `payment_pending` order ready for its capture (phase 1).

    As `order_payment_start`, with the capture's first step in the same
    statement (`payments.capture.payment_prepare`): the payment is `pending`
    with its call's transaction and settlement rows when the phase commits,
    so the keyed checkout sends the call right after it and records the
    answer in its last transaction (docs/checkout.md, "Two transactions").
    Return the prepared capture, or None when nothing was prepared: a free
    order (confirmed at once) or a payment that existed (captured the long
    way, `payment_capture`).
    """
    assert order.status == OrderStatus.PAYMENT_PENDING, order.status
    if order.total == 0:
        _payment_record(order=order, succeeded=True, lines=order.held_lines)
        return None
    prepared = payment_prepare(
        payment_id=order.payment_id or uuid.uuid4(),
        reference=f"order-{order.number}",
        amount=order.total,
        currency=order.currency,
        payment_method=order.payment_method,
        owner=order.owner,
    )
    payment = prepared.payment if isinstance(prepared, PreparedCapture) else prepared
    if order.payment_id != payment.id:
        # Placed without the id (`order_hold`), or the payment existed already.
        Order.objects.filter(id=order.id).update(payment=payment)
    order.payment = payment
    return prepared if isinstance(prepared, PreparedCapture) else None


@transaction.atomic(savepoint=False)
def order_payment_recorded(*, order: Order, payment: Payment) -> Order:
    """Apply the outcome this transaction just recorded for `payment` to the order it pays.

    The recording locked the payment row (`payments.capture.payment_capture_record`:
    the same lock, in the same place of the lock order, as `order_payment_apply`
    takes), so its status is the one to follow, without reading it again; the
    order and its `held_lines` are the ones phase 1 inserted, and the order's
    conditional UPDATE decides whether they are still `payment_pending`. A
    payment still pending leaves the order `payment_pending` with its flags held.
    """
    order.payment = payment
    if payment.status in _CAPTURED_STATUSES:
        return _payment_record(order=order, succeeded=True, lines=order.held_lines)
    if payment.status == PaymentStatus.FAILED:
        return _payment_record(order=order, succeeded=False, lines=order.held_lines)
    return order


_CAPTURED_STATUSES = frozenset(
    {PaymentStatus.CAPTURED, PaymentStatus.PARTIALLY_REFUNDED, PaymentStatus.REFUNDED}
)


@transaction.atomic(savepoint=False)
def order_payment_apply(*, order_id) -> Order:
    """Bring a `payment_pending` order in line with its payment's recorded outcome.

    The payment row is locked first (settlement takes the same locks in the
    same order: payment, then order), so an outcome being recorded right now
    is either seen or waited for, never missed. A payment still pending
    leaves the order `payment_pending` with its flags held.
    """
    order = lock_objects.order_read_payment_lock(order_id=order_id)
    payment = order.payment
    if payment is None:
        return order
    if payment.status in _CAPTURED_STATUSES:
        return _payment_record(order=order, succeeded=True)
    if payment.status == PaymentStatus.FAILED:
        return _payment_record(order=order, succeeded=False)
    return order


def order_payment_settled(*, payment: Payment, outcome: Outcome) -> None:
    """Apply a payment outcome that settlement recorded (settings.PAYMENTS_SETTLED_HANDLER).

    Called inside the transaction that records it, with the payment locked,
    so the order and the payment change together. A payment that is not an
    order's is none of this handler's business.
    """
    order_id = Order.objects.filter(payment_id=payment.id).values_list("id", flat=True).first()
    if order_id is None:
        return
    order_payment_record(order_id=order_id, succeeded=outcome == Outcome.SUCCEEDED)


@transaction.atomic
def order_decide_confirm(*, order_id) -> Order:
    """Take the shopper's "yes" to an `awaiting_decision` order: move it to `payment_pending`.

    Confirming and expiring race through the same conditional UPDATE on the
    order row, so exactly one wins. If the decision came too late and the
    sweeper has not run yet, expire the order here (the same conditional
    UPDATE the sweeper would make). Return the order in whatever state it
    ends; the caller answers from it (`expired` → 409 reservation_expired).
    """
    order = Order.objects.select_related("owner").get(id=order_id)
    moved = order_transition(
        order=order,
        source=OrderStatus.AWAITING_DECISION,
        target=OrderStatus.PAYMENT_PENDING,
        kind="confirmed_by_shopper",
        condition=Q(reservation_expires_at__gt=Now()),
    )
    if moved is not None:
        # While the payment's outcome is being decided, the flags never expire.
        inventory_services.reservations_set_expiry(
            reservation_ids=_reservation_ids(OrderLine.objects.filter(order_id=order_id)),
            expires_at=None,
        )
        return order
    order_expire(order_id=order_id)
    return Order.objects.select_related("owner").get(id=order_id)


@transaction.atomic
def order_cancel(*, order_id) -> Order:
    """Cancel an order: awaiting a decision → flags reset, `cancelled`; confirmed → `cancelling`.

    A confirmed (or partially confirmed) order with nothing shipped moves to
    `cancelling` under the order's row lock — the lock a shipment takes, so
    a cancel and a shipment racing for the order are decided one after the
    other: the shipment refuses a cancelling order, the cancel refuses a
    shipped one (409 `order_shipped`). The transition's transaction inserts
    the compensation steps (orders.compensation); the last one to finish
    moves the order to `cancelled` (`order_cancel_complete`). The returned
    order carries `cancel_started` (True only for the call that started it).
    Already cancelling or cancelled → returned unchanged.
    """
    order = Order.objects.get(id=order_id)
    order.cancel_started = False
    moved = order_transition(
        order=order,
        source=OrderStatus.AWAITING_DECISION,
        target=OrderStatus.CANCELLED,
        kind="cancelled_by_shopper",
        line_source=LineStatus.RESERVED,
        line_target=LineStatus.CANCELLED,
    )
    if moved is not None:
        inventory_services.reservations_release(reservation_ids=_reservation_ids(moved))
        _publish(order=order, event_type=OrderEventType.CANCELLED)
        _scope_follows(order=order, kept=False)
        return order

    order = lock_objects.order_lock(order_id=order_id)
    lines = lock_objects.order_lines_lock(order_id=order_id)
    failpoint("orders.cancel.locked")
    order.cancel_started = False
    if order.status in (OrderStatus.CANCELLED, OrderStatus.CANCELLING):
        return order
    if order.fulfillment != Fulfillment.UNFULFILLED or any(line.quantity_shipped for line in lines):
        raise OrderShipped(_("Part of this order has shipped; return it instead."))
    if order.status == OrderStatus.PAYMENT_PENDING:
        raise PaymentPending(
            _("The payment's outcome is not known yet; cancel once it is."),
            extra={"order_id": str(order.id)},
        )
    if order.status in (OrderStatus.CONFIRMED, OrderStatus.PARTIALLY_CONFIRMED):
        started = order_transition(
            order=order,
            source=order.status,
            target=OrderStatus.CANCELLING,
            kind="cancellation_started",
        )
        assert started is not None, "the order moved under its row lock"
        compensation.steps_insert(order_id=order.id, kind=CompensationKind.CANCELLATION)
        order.cancel_started = True
        return order
    raise InvalidState(
        _("An order that is {status} cannot be cancelled.").format(status=order.status)
    )


@transaction.atomic
def order_expire(*, order_id) -> bool:
    """Expire an `awaiting_decision` order past `reservation_expires_at` (database clock).

    Reset its flags (`expired`) and release its lines. Return False when it
    is not due or another transaction (a confirm, a cancel, a second
    sweeper) moved it first.
    """
    order = Order(id=order_id)
    moved = order_transition(
        order=order,
        source=OrderStatus.AWAITING_DECISION,
        target=OrderStatus.EXPIRED,
        kind="reservation_expired",
        condition=Q(reservation_expires_at__lte=Now()),
        line_source=LineStatus.RESERVED,
        line_target=LineStatus.RELEASED,
    )
    if moved is None:
        return False
    inventory_services.reservations_expire(reservation_ids=_reservation_ids(moved))
    expired = Order.objects.get(id=order_id)
    _publish(order=expired, event_type=OrderEventType.EXPIRED)
    _scope_follows(order=expired, kept=False)
    return True


def orders_expire_due(*, limit: int = 500) -> int:
    """Expire every `awaiting_decision` order that is due, each in its own transaction.

    Safe to run twice at once (each order is won by one run) and after a
    crash (the rest are still due). Return how many this run expired.
    """
    due = (
        Order.objects.filter(
            status=OrderStatus.AWAITING_DECISION, reservation_expires_at__lte=Now()
        )
        .order_by("reservation_expires_at")
        .values_list("id", flat=True)[:limit]
    )
    return sum(order_expire(order_id=order_id) for order_id in list(due))
