"""The keyed checkout operations: atomic phases around one provider call.

They decide domain results (idempotency.keys.Result: the order, a
refusal; final or still open) and leave the answer to the caller's
presenter: the API's (orders/api/presenters.py) renders the contract's
JSON, a storefront form would redirect to the order page. The presenter
runs inside the phase that decided, so the answer commits with the effect;
the completer resumes with the presenter declared for the key's operation
(`keyed_operation` in orders/api/presenters.py). Nothing here imports the API.

`order.create` (POST /orders/) and `order.confirm` (POST /orders/{id}/confirm/):

    started ──phase 1, one transaction──▶ reserved
        create: hold the flags, create the order and its payment row
        confirm: awaiting_decision → payment_pending (races expiry), payment row
        (decided in phase 1: an `awaiting_decision` order, an expired one,
         a refusal raised before anything committed: each stored)
    reserved ──payment_capture: no transaction, no row lock──▶
        ──phase 3: lock the payment, read what it became, apply it to the order──▶
            captured → confirmed / partially_confirmed, flags committed   (finished)
            failed   → payment_failed, flags reset, refused (API: 402)    (finished)
            pending  → payment_pending, key left open (API: 202)  (payment_unknown)
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

import uuid
from decimal import Decimal

from django.utils.translation import gettext as _

from core.errors import ApplicationError, InvalidState
from idempotency.failpoints import failpoint
from idempotency.keys import STARTED, KeyRun, Presenter, Result, close_run, keyed_phase
from payments.capture import (
    PreparedCapture,
    payment_capture,
    payment_capture_record,
    payment_capture_send,
    payment_lookup_once,
)
from payments.errors import RefundInvalidState
from payments.refunds import refund_request
from payments.states import RefundOrigin

from . import selectors, services, shipments
from .models import Order
from .services import LineRequest
from .states import OrderStatus

CREATE = "order.create"
CONFIRM = "order.confirm"
CANCEL = "order.cancel"
SHIPMENT_CREATE = "shipment.create"
REFUND_CREATE = "refund.create"
RETURN_CREATE = "return.create"
RETURN_RECEIVE = "return.receive"

RESERVED = "reserved"
PAYMENT_UNKNOWN = "payment_unknown"
CANCELLED = "cancelled"
SHIPPED = "shipped"
REFUNDED = "refund_requested"
RETURN_REQUESTED = "return_requested"
RETURN_RECEIVED = "return_received"


def order_result(order: Order) -> Result:
    """Say what the order's current state means for the keyed request that moved it.

    An order the phase just moved carries its current lines and payment; any
    other is read again (another transaction may have moved it).
    """
    if not selectors.order_is_loaded(order):
        order = selectors.order_get(order_id=order.id)
    extra = {"order_id": str(order.id)}
    if order.status in (
        OrderStatus.CONFIRMED,
        OrderStatus.PARTIALLY_CONFIRMED,
        OrderStatus.AWAITING_DECISION,
    ):
        return Result.done(order)
    if order.status == OrderStatus.PAYMENT_PENDING:
        return Result.pending(order)
    refusal: ApplicationError
    if order.status == OrderStatus.PAYMENT_FAILED:
        refusal = services.PaymentDeclined(
            "The payment was declined; nothing was charged.", extra=extra
        )
    elif order.status == OrderStatus.EXPIRED:
        refusal = services.ReservationExpired(
            "The reservation expired before the order was confirmed.", extra=extra
        )
    else:
        refusal = InvalidState(f"The order is {order.status}.", extra=extra)
    return Result.refused(refusal, value=order)


def _capture_prepared(
    run: KeyRun, present: Presenter, *, order: Order, capture: PreparedCapture
) -> None:
    """Send the capture phase 1 prepared (no transaction open), then record its answer and
    apply it to the order in one transaction, the last (docs/checkout.md, "Two transactions").

    A crash before that commits leaves the key `reserved` and the payment
    `pending` with its due settlement row: a retry or the completer sends the
    same provider key again (`_capture`), settlement asks the provider; either
    way one charge, recorded once.
    """
    failpoint("checkout.capture.before")
    result = payment_capture_send(capture=capture)
    failpoint("checkout.capture.after")
    with run.phase(next_point=PAYMENT_UNKNOWN):
        recorded = payment_capture_record(capture=capture, result=result)
        order = services.order_payment_recorded(order=order, payment=recorded.payment)
        close_run(run, order_result(order), present)


def _capture(run: KeyRun, present: Presenter) -> None:
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
        close_run(run, order_result(order), present)


def order_place_keyed(
    *,
    run: KeyRun,
    present: Presenter,
    user,
    lines: list[LineRequest],
    on_shortage: str,
    payment_method: str,
    shipping_address: dict,
    expected_total: Decimal | None = None,
    scope: str | None = None,
    language: str | None = None,
) -> None:
    """Place an order under a request key; resume a retried key at its recovery point.

    `present` turns each result (the order, or a refusal such as
    insufficient_stock) into the caller's answer. `scope` (the storefront's
    cart version; the API passes none) outlives the key: a scope that already
    has an order is refused `already_ordered`, naming it (services.order_hold).
    `language` (the storefront page's; the API passes none) is the order's e-mails'.
    """
    if run.recovery_point == STARTED:
        with keyed_phase(run, present, next_point=RESERVED) as data:
            order = services.order_hold(
                owner=user,
                lines=lines,
                on_shortage=on_shortage,
                payment_method=payment_method,
                shipping_address=shipping_address,
                expected_total=expected_total,
                scope=scope,
                language=language,
                payment_id=uuid.uuid4(),
            )
            failpoint("checkout.reserve.after_hold")
            data["order_id"] = str(order.id)
            capture = None
            if order.status == OrderStatus.PAYMENT_PENDING:
                capture = services.order_payment_prepare(order=order)
                data["payment_id"] = order.payment_id and str(order.payment_id)
            if order.status != OrderStatus.PAYMENT_PENDING:
                # Awaiting the shopper, or free and confirmed.
                close_run(run, order_result(order), present)
        if run.closed:
            return
        if capture is not None:
            _capture_prepared(run, present, order=order, capture=capture)
            return
    _capture(run, present)


def order_confirm_keyed(*, run: KeyRun, present: Presenter, order_id) -> None:
    """Confirm an `awaiting_decision` order under a request key and charge what is reserved."""
    if run.recovery_point == STARTED:
        with keyed_phase(run, present, next_point=RESERVED) as data:
            data["order_id"] = str(order_id)
            order = services.order_decide_confirm(order_id=order_id)
            if order.status == OrderStatus.PAYMENT_PENDING and order.payment_id is None:
                order = services.order_payment_start(order=order)
            # Already paying (another key's confirm): join the same capture.
            data["payment_id"] = order.payment_id and str(order.payment_id)
            if order.status != OrderStatus.PAYMENT_PENDING:
                close_run(run, order_result(order), present)
        if run.closed:
            return
    _capture(run, present)


def order_cancel_keyed(*, run: KeyRun, present: Presenter, order_id) -> None:
    """Cancel an order under a request key; refusals (409) are stored like answers."""
    with keyed_phase(run, present, next_point=CANCELLED):
        order = services.order_cancel(order_id=order_id)
        answer = selectors.order_get(order_id=order.id)
        answer.cancel_started = getattr(order, "cancel_started", False)
        close_run(run, Result.done(answer), present)


def shipment_create_keyed(
    *,
    run: KeyRun,
    present: Presenter,
    order_id,
    lines: list[shipments.ShipmentLineRequest] | None,
    carrier: str | None,
    tracking_number: str | None,
    form_scope: str | None = None,
) -> None:
    """Ship an order's units under a request key; refusals (409, 422) are stored like answers.

    `form_scope`: the admin form's owner and key, kept on the shipment (one per form shown)."""
    with keyed_phase(run, present, next_point=SHIPPED):
        shipment = shipments.shipment_create(
            order_id=order_id,
            lines=lines,
            carrier=carrier,
            tracking_number=tracking_number,
            form_scope=form_scope,
        )
        close_run(run, Result.done(shipment), present)


# Refund ids of the admin's refund form: uuid5(FORM_REFUND_NAMESPACE, <owner>:<the form's key>).
FORM_REFUND_NAMESPACE = uuid.UUID("0b7e2f4c-3d1a-5e6b-8f90-a1b2c3d4e5f6")


def form_refund_id(form_scope: str) -> uuid.UUID:
    """The refund id a refund form names: uuid5 of its scope (its owner and its key,
    `KeyRequest.scope`; the key: orders.admin.order.refund_form_key).

    The refund's primary key and its provider key's `payments_refund_key_uniq`
    then make that form one refund for the refund's whole life, also after
    the request key was purged (docs/idempotency.md, "Business scopes that
    outlive request keys").
    """
    return uuid.uuid5(FORM_REFUND_NAMESPACE, form_scope)


def refund_create_keyed(
    *,
    run: KeyRun,
    present: Presenter,
    order_id,
    amount: Decimal,
    reason: str,
    requested_by,
    refund_id: uuid.UUID | None = None,
) -> None:
    """Ask for a staff (goodwill) refund of an order's payment under a request key.

    One phase: the refund id is minted HERE (uuid4; a form passes the one
    its key names, `form_refund_id`) and committed with the refund row, its
    reservation and the stored answer, so a retry of the key replays that
    answer and never mints a second refund; a refusal (409 nothing captured,
    422 more than refundable) is stored like an answer. The same refund id
    again (a form sent after its key was purged) answers the refund it made.
    The value handed to the presenter is the refund with its `order_id`.
    """
    with keyed_phase(run, present, next_point=REFUNDED) as data:
        refund_id = refund_id or uuid.uuid4()
        data["refund_id"] = str(refund_id)
        payment_id = Order.objects.values_list("payment_id", flat=True).get(id=order_id)
        if payment_id is None:
            raise RefundInvalidState(
                _("Nothing to refund: the order has no payment."),
                extra={"order_id": str(order_id)},
            )
        refund = refund_request(
            refund_id=refund_id,
            payment_id=payment_id,
            amount=amount,
            reason=reason,
            origin=RefundOrigin.GOODWILL,
            requested_by=requested_by,
        )
        # Not a Refund field: the answer's order, for the presenter (payments knows no orders).
        refund.order_id = order_id  # type: ignore[attr-defined]
        close_run(run, Result.done(refund), present)


def order_resume(run: KeyRun, present: Presenter) -> None:
    """Drive an abandoned `order.create` / `order.confirm` key to its answer (the completer).

    Nothing committed: forget the key. Phase 1 committed: take the payment
    and record it (the same provider key: at most one charge). Left open
    while pending: record what settlement found, if anything yet, without
    calling the provider (settlement does that on its own schedule).
    `present` is the presenter declared for the key's operation, so the
    stored answer is the one its caller would have stored.
    """
    if run.recovery_point == STARTED:
        run.abandon()
        return
    if run.recovery_point == PAYMENT_UNKNOWN:
        with run.phase(next_point=PAYMENT_UNKNOWN):
            order = services.order_payment_apply(order_id=run.data["order_id"])
            close_run(run, order_result(order), present)
        return
    _capture(run, present)


# --- Returns (orders/returns.py) ----------------------------------------------------


def return_create_keyed(
    *,
    run: KeyRun,
    present: Presenter,
    order_id,
    lines,
    reason: str,
    requested_by,
    form_scope: str | None = None,
) -> None:
    """Ask for a return under a request key: one phase; refusals (422) are stored like answers.

    A 400 (a sku not in the order) is not stored: the key is released.
    `form_scope`: the storefront form's owner and key, kept on the return (one per form shown).
    """
    from . import returns

    with keyed_phase(run, present, next_point=RETURN_REQUESTED):
        order_return = returns.return_request(
            order_id=order_id,
            lines=lines,
            reason=reason,
            requested_by=requested_by,
            form_scope=form_scope,
        )
        close_run(run, Result.done(order_return), present)


def return_receive_keyed(*, run: KeyRun, present: Presenter, return_id, by) -> None:
    """Mark a return received under a request key (one phase): the compensation starts once."""
    from . import returns

    with keyed_phase(run, present, next_point=RETURN_RECEIVED):
        order_return = returns.return_receive(return_id=return_id, by=by)
        close_run(run, Result.done(order_return), present)
