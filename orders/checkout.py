"""The keyed checkout operations: atomic phases around one provider call.

`order.create` (POST /orders/) and `order.confirm` (POST /orders/{id}/confirm/):

    started ──phase 1, one transaction──▶ reserved
        create: hold the flags, create the order and its payment row
        confirm: awaiting_decision → payment_pending (races expiry), payment row
        (answered in phase 1: an `awaiting_decision` order 201, an expired
         one 409, a refusal raised before anything committed is stored)
    reserved ──payment_capture: no transaction, no row lock──▶
        ──phase 3: lock the payment, read what it became, apply it to the order──▶
            captured → confirmed / partially_confirmed, flags committed   (finished)
            failed   → payment_failed, flags reset, 402                   (finished)
            pending  → 202 payment_pending, key left open       (payment_unknown)
    payment_unknown ──a retry asks the provider once (look-up)──▶ phase 3 again

The provider key is derived from the order number (payments.keys), so a
capture repeated by a retry, the completer or settlement is one charge.
Phase 3 decides from the payment row under its lock, never from what this
process heard: settlement may have recorded the outcome meanwhile.

Failpoints: every phase has `<operation>.<point>.before_commit` and
`.after_commit` (idempotency.keys); besides, `checkout.reserve.after_hold`
(inside phase 1), `checkout.capture.before` and `checkout.capture.after`
(around the provider call, no transaction open).
"""

from __future__ import annotations

from decimal import Decimal

from idempotency.failpoints import failpoint
from idempotency.keys import KeyRun
from idempotency.models import STARTED
from payments.services import payment_capture, payment_lookup_once

from . import selectors, services
from .api.serializers import order_body
from .models import Order
from .services import LineRequest
from .states import OrderStatus

CREATE = "order.create"
CONFIRM = "order.confirm"
CANCEL = "order.cancel"

RESERVED = "reserved"
PAYMENT_UNKNOWN = "payment_unknown"
CANCELLED = "cancelled"

SUCCESS_STATUS = {CREATE: 201, CONFIRM: 200}


def _answer(run: KeyRun, order: Order) -> None:
    """Give the answer the order's current state calls for (inside the last phase).

    An order the phase just moved carries its current lines and payment; any
    other is read again (another transaction may have moved it).
    """
    if not selectors.order_is_loaded(order):
        order = selectors.order_get(order_id=order.id)
    if order.status in (
        OrderStatus.CONFIRMED,
        OrderStatus.PARTIALLY_CONFIRMED,
        OrderStatus.AWAITING_DECISION,
    ):
        run.finish(status=SUCCESS_STATUS[run.operation], body=order_body(order))
    elif order.status == OrderStatus.PAYMENT_PENDING:
        run.leave_open(status=202, body=order_body(order))
    elif order.status == OrderStatus.PAYMENT_FAILED:
        run.finish_problem(
            services.PaymentDeclined(
                "The payment was declined; nothing was charged.",
                extra={"order_id": str(order.id)},
            )
        )
    elif order.status == OrderStatus.EXPIRED:
        run.finish_problem(
            services.ReservationExpired(
                "The reservation expired before the order was confirmed.",
                extra={"order_id": str(order.id)},
            )
        )
    else:
        run.finish_problem(
            services.InvalidState(
                f"The order is {order.status}.", extra={"order_id": str(order.id)}
            )
        )


def _charge(run: KeyRun) -> None:
    """Take the payment (no transaction open), then record what it became (phase 3)."""
    data = run.data
    order_id = data["order_id"]
    if "payment_id" in data:  # None: a free order, nothing to charge
        payment_id = data["payment_id"]
    else:
        payment_id = Order.objects.values_list("payment_id", flat=True).get(id=order_id)
    if payment_id is not None:
        failpoint("checkout.capture.before")
        if run.recovery_point == PAYMENT_UNKNOWN:
            # The contract: a retry of a pending answer may ask the provider once.
            payment_lookup_once(payment_id=payment_id)
        else:
            payment_capture(payment_id=payment_id)
        failpoint("checkout.capture.after")
    with run.phase(next_point=PAYMENT_UNKNOWN):
        order = services.order_payment_apply(order_id=order_id)
        _answer(run, order)


def order_place_keyed(
    *,
    run: KeyRun,
    user,
    lines: list[LineRequest],
    on_shortage: str,
    payment_method: str,
    shipping_address: dict,
    expected_total: Decimal | None = None,
) -> None:
    """Place an order under a request key; resume a retried key at its recovery point."""
    if run.recovery_point == STARTED:
        with run.phase(next_point=RESERVED) as data:
            order = services.order_reserve(
                owner=user,
                lines=lines,
                on_shortage=on_shortage,
                payment_method=payment_method,
                shipping_address=shipping_address,
                expected_total=expected_total,
            )
            failpoint("checkout.reserve.after_hold")
            data["order_id"] = str(order.id)
            if order.status == OrderStatus.PAYMENT_PENDING:
                order = services.order_payment_start(order=order)
                data["payment_id"] = order.payment_id and str(order.payment_id)
            if order.status != OrderStatus.PAYMENT_PENDING:
                _answer(run, order)  # awaiting the shopper, or free and confirmed
        if run.closed:
            return
    _charge(run)


def order_confirm_keyed(*, run: KeyRun, order_id) -> None:
    """Confirm an `awaiting_decision` order under a request key and charge what is reserved."""
    if run.recovery_point == STARTED:
        with run.phase(next_point=RESERVED) as data:
            data["order_id"] = str(order_id)
            order = services.order_decide_confirm(order_id=order_id)
            if order.status == OrderStatus.PAYMENT_PENDING and order.payment_id is None:
                order = services.order_payment_start(order=order)
            # Already paying (another key's confirm): join the same capture.
            data["payment_id"] = order.payment_id and str(order.payment_id)
            if order.status != OrderStatus.PAYMENT_PENDING:
                _answer(run, order)
        if run.closed:
            return
    _charge(run)


def order_cancel_keyed(*, run: KeyRun, order_id) -> None:
    """Cancel an order under a request key; refusals (409) are stored like answers."""
    with run.phase(next_point=CANCELLED):
        order = services.order_cancel(order_id=order_id)
        run.finish(status=200, body=order_body(selectors.order_get(order_id=order.id)))


def order_resume(run: KeyRun) -> None:
    """Drive an abandoned `order.create` / `order.confirm` key to its answer (the completer).

    Nothing committed: forget the key. Phase 1 committed: take the payment
    and record it (the same provider key: at most one charge). Left open
    while pending: record what settlement found, if anything yet, without
    calling the provider (settlement does that on its own schedule).
    """
    if run.recovery_point == STARTED:
        run.abandon()
        return
    if run.recovery_point == PAYMENT_UNKNOWN:
        with run.phase(next_point=PAYMENT_UNKNOWN):
            _answer(run, services.order_payment_apply(order_id=run.data["order_id"]))
        return
    _charge(run)


def single_phase_resume(run: KeyRun) -> None:
    """An abandoned single-phase key committed nothing (its one phase stores the answer)."""
    if run.recovery_point == STARTED:
        run.abandon()
