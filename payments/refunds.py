"""Refunds: ask for one within the budget, the task that calls the provider, staff decisions.

A refund is a due row (`Refund`, core.due) inserted with its amount reserved
on the payment, in one transaction, before any provider call
(`refund_request`; `refundable` is THE budget read, `refund_request_capped`
sizes a refund to fit); the call runs in the `payments.refund` task with no
transaction open (`refund_run`); its answer (or a webhook's, or staff's) is
recorded by ONE conditional transition of the refund row
(`payments.recording`), so whoever records first wins and every later
recorder changes nothing. Staff decide a refund that needs attention, and the
provider's late word after such a decision is a needs-attention item of its
own. docs/payments.md, "Refunds".
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import cast

from django.conf import settings
from django.db import connection, transaction
from django.utils.translation import gettext as _

from core import due
from core.errors import InvalidRequest
from core.money import format_money, minor_units
from idempotency.failpoints import failpoint

from .errors import (
    RefundBudgetMoved,
    RefundConflict,
    RefundExceedsCaptured,
    RefundInvalidState,
    require_no_transaction,
)
from .gateway import Outcome, ProviderResult, get_gateway
from .keys import install_id, provider_key
from .lock_objects import payment_lock
from .models import (
    Payment,
    PaymentEvent,
    PaymentStatus,
    PaymentTransaction,
    Refund,
    TransactionKind,
    TransactionStatus,
)
from .recording import refund_flag, refund_record
from .transitions import sql_table

_REFUNDABLE_STATUSES = (PaymentStatus.CAPTURED, PaymentStatus.PARTIALLY_REFUNDED)


def refund_provider_key(*, refund_id: uuid.UUID, install: str | None = None) -> str:
    """The provider key of one refund: `<install id>:refund-<refund id>:refund`."""
    return provider_key(
        install=install or install_id(), reference=f"refund-{refund_id}", kind="refund"
    )


def _refund_amount_check(*, amount: Decimal, currency: str) -> None:
    if (
        not isinstance(amount, Decimal)
        or not amount.is_finite()
        or amount <= 0
        or -cast(int, amount.as_tuple().exponent) > minor_units(currency)
    ):
        raise InvalidRequest(
            _("Invalid refund amount {amount}.").format(amount=amount),
            errors={
                "amount": [
                    _("Must be positive, with at most {places} decimals.").format(
                        places=minor_units(currency)
                    )
                ]
            },
        )


def refund_reserve(*, payment_id, amount: Decimal) -> bool:
    """Hold `amount` of the payment's refund budget if it still fits; True if it did.

    ONE conditional UPDATE (`refund_reserved + amount <= amount_captured`,
    row count checked) under the CHECK `refunded <= refund_reserved <=
    captured`: a request reserves by it, and so does a refund recorded failed
    that the provider refunded after all (`payments.refund_decisions`).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {sql_table(Payment)} SET refund_reserved = refund_reserved + %s,"
            " updated_at = statement_timestamp()"
            " WHERE id = %s AND status = ANY(%s) AND refund_reserved + %s <= amount_captured",
            [amount, payment_id, list(_REFUNDABLE_STATUSES), amount],
        )
        return cursor.rowcount == 1


def refund_request(
    *,
    refund_id: uuid.UUID,
    payment_id,
    amount: Decimal,
    reason: str,
    origin: str,
    requested_by=None,
) -> Refund:
    """Ask for a refund of `amount` of the payment, once per `refund_id`; return the refund row.

    One transaction (a savepoint inside the caller's) that takes the payment's
    row lock first (`payment_lock`: a cancellation's refund step reads the
    budget under it, docs/compensation.md): the refund row and its
    provider call's transaction row are inserted first (the refund id's
    primary key and the derived key's unique constraint: the same refund id
    again is "already requested" and returns the existing row, whatever its
    amount), then ONE conditional UPDATE reserves the amount on the payment
    (`refund_reserved + amount <= amount_captured`, row count checked). A
    refusal rolls the insert back: nothing reserved, nothing sent. The
    provider call is the `payments.refund` task's, rung after commit and
    swept by beat.

    Refusals: nothing captured → 409 `invalid_state`; more than still
    refundable → 422 `refund_exceeds_captured` (with `refundable`).
    """
    install = install_id()
    key = refund_provider_key(refund_id=refund_id, install=install)
    with transaction.atomic():
        # The payment's row lock first (the lock order: the payment, then its rows): what a
        # cancellation's refund step holds while it reads the budget and asks for the rest.
        payment = payment_lock(payment_id=payment_id)
        _refund_amount_check(amount=amount, currency=payment.currency)
        sql = (
            f"WITH txn AS (INSERT INTO {sql_table(PaymentTransaction)}"
            "  (payment_id, kind, provider_key, amount, currency, status, provider_operation_id,"
            "   last_error) VALUES (%s, %s, %s, %s, %s, %s, '', '')"
            "  ON CONFLICT ON CONSTRAINT payments_transaction_payment_kind_key_uniq DO NOTHING"
            "  RETURNING id)"
            f" INSERT INTO {sql_table(Refund)} (id, payment_id, transaction_id, amount, currency,"
            "  reason, origin, status, provider_key, requested_by_id)"
            " SELECT %s, %s, txn.id, %s, %s, %s, %s, %s, %s, %s FROM txn"
            " ON CONFLICT DO NOTHING RETURNING id"
        )
        params = [
            payment.id,
            TransactionKind.REFUND,
            key,
            amount,
            payment.currency,
            TransactionStatus.UNKNOWN,
            refund_id,
            payment.id,
            amount,
            payment.currency,
            reason[:500],
            origin,
            "pending",
            key,
            getattr(requested_by, "pk", None),
        ]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            inserted = cursor.fetchone() is not None
        if not inserted:
            existing = Refund.objects.filter(id=refund_id).first()
            if existing is None or existing.payment_id != payment.id:
                raise RefundConflict(
                    _("Refund {refund_id} exists for another payment.").format(refund_id=refund_id)
                )
            return existing  # already requested: one refund per refund id
        if not refund_reserve(payment_id=payment.id, amount=amount):
            _refund_refused(payment_id=payment.id, amount=amount)
        PaymentEvent.objects.create(
            payment_id=payment.id,
            kind="refund_requested",
            from_status=payment.status,
            to_status=payment.status,
            detail={
                "refund_id": str(refund_id),
                "provider_key": key,
                "amount": str(amount),
                "origin": origin,
            },
        )
        due.ring_after_commit(Refund, refund_id)
    return Refund.objects.get(id=refund_id)


def refundable(*, payment: Payment) -> Decimal:
    """THE refund budget: what is still refundable = captured − refunded − refunds in progress.

    `refund_reserved` is what refunds succeeded or still in progress hold
    (pending, needing attention, or a provider's late success being decided),
    so this is `amount_captured − refund_reserved`. The database enforces it:
    the reservation is a conditional UPDATE under the CHECK
    `refunded <= refund_reserved <= captured` (`refund_request`); this is
    only the read of it, for callers that size a refund to fit.
    """
    if payment.status not in _REFUNDABLE_STATUSES:
        return Decimal(0)
    return max(payment.amount_captured - payment.refund_reserved, Decimal(0))


def refunds_in_progress(*, payment: Payment) -> Decimal:
    """What refunds not yet ended hold of the budget (reserved, not refunded)."""
    return payment.refund_reserved - payment.amount_refunded


def refund_request_capped(
    *,
    refund_id: uuid.UUID,
    payment_id,
    at_most: Decimal,
    reason: str,
    origin: str,
    tries: int = 3,
) -> Refund | None:
    """Ask for a refund of `at_most` capped at what is still refundable now, once per refund id.

    Returns the refund row (the existing one, whatever its amount, if the
    refund id was requested before), or None when nothing is refundable (a
    refund's amount is positive: no row, no provider call). The cap is read,
    then reserved by `refund_request`'s conditional UPDATE; if a concurrent
    refund took the budget in between, the reservation is refused and the
    budget is read again (`tries` times, then `RefundBudgetMoved`).
    """
    for _attempt in range(tries):
        existing = Refund.objects.filter(id=refund_id).first()
        if existing is not None:
            if existing.payment_id != payment_id:
                raise RefundConflict(
                    _("Refund {refund_id} exists for another payment.").format(refund_id=refund_id)
                )
            return existing
        amount = min(at_most, refundable(payment=Payment.objects.get(id=payment_id)))
        if amount <= 0:
            return None
        try:
            return refund_request(
                refund_id=refund_id,
                payment_id=payment_id,
                amount=amount,
                reason=reason,
                origin=origin,
            )
        except (RefundExceedsCaptured, RefundInvalidState):
            continue  # the budget moved between the read and the reservation: read it again
    raise RefundBudgetMoved(f"the refund budget of payment {payment_id} kept moving")


def _refund_refused(*, payment_id, amount: Decimal):
    """Raise the refusal of a reservation that did not fit (the payment as it is now)."""
    payment = Payment.objects.get(id=payment_id)
    if payment.status not in _REFUNDABLE_STATUSES or payment.amount_captured <= 0:
        raise RefundInvalidState(
            _("Nothing to refund: the payment is {status}.").format(status=payment.status),
            extra={"payment_status": payment.status},
        )
    left = refundable(payment=payment)
    text = format_money(left, payment.currency)
    raise RefundExceedsCaptured(
        _(
            "At most {left} {currency} can still be refunded (captured {captured}, refunded or "
            "being refunded {reserved}); asked {amount}."
        ).format(
            left=text,
            currency=payment.currency,
            captured=format_money(payment.amount_captured, payment.currency),
            reserved=format_money(payment.refund_reserved, payment.currency),
            amount=format_money(amount, payment.currency),
        ),
        errors={
            "amount": [_("At most {left} {currency}.").format(left=text, currency=payment.currency)]
        },
        extra={"refundable": text, "currency": payment.currency},
    )


def _refund_capture_key(*, payment_id) -> str:
    key = (
        PaymentTransaction.objects.filter(
            payment_id=payment_id,
            kind=TransactionKind.CAPTURE,
            status=TransactionStatus.SUCCEEDED,
        )
        .values_list("provider_key", flat=True)
        .first()
    )
    if key is None:
        raise RefundInvalidState(_("The payment has no succeeded capture to refund."))
    return key


def refund_run(*, refund_id) -> Refund | None:
    """Make one attempt at a refund if it is due (the `payments.refund` task's body).

    Must be called with no transaction open. `core.due.attempt_begin` lets one
    runner take the attempt and pushes the next one back before calling out,
    so a runner killed mid-call leaves the row due later for the sweeper. A
    retried attempt looks the key up first (a lost answer is settled by the
    provider's record; unknown stays pending); a key the provider never got
    is sent again, under the same key.
    """
    require_no_transaction("refund_run")
    attempt = due.attempt_begin(Refund, pk=refund_id)
    if attempt.budget_spent:
        refund_flag(
            refund_id=refund_id,
            reason=f"not refunded after {settings.PAYMENTS_REFUND_MAX_ATTEMPTS} attempts",
        )
    if not attempt.taken:
        return Refund.objects.filter(id=refund_id).first()  # None: no such row (a stale bell)
    refund = Refund.objects.select_related("payment").get(id=refund_id)
    gateway = get_gateway()
    result: ProviderResult | None = None
    if attempt.number > 1:
        result = gateway.lookup(key=refund.provider_key)
        if result.outcome == Outcome.NOT_FOUND:
            result = None
    if result is None:
        capture_key = _refund_capture_key(payment_id=refund.payment_id)
        failpoint("payments.refund.before_provider")
        result = gateway.refund(
            key=refund.provider_key,
            capture_key=capture_key,
            amount=refund.amount,
            currency=refund.currency,
            reference=refund.payment.reference,
        )
        failpoint("payments.refund.after_provider")
        if result.outcome == Outcome.UNKNOWN:
            # The answer was lost (timeout): the provider's record under the key decides.
            looked_up = gateway.lookup(key=refund.provider_key)
            if looked_up.outcome in (Outcome.SUCCEEDED, Outcome.DECLINED):
                result = looked_up
    refund_record(refund=refund, result=result, mode="task", attempt=attempt)
    return Refund.objects.get(id=refund_id)
