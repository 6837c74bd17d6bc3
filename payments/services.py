"""Writes of the payments app: create a payment, capture it, settle lost answers.

The rule that shapes everything here: never call the provider inside a
database transaction. A capture is three steps:

1. one transaction prepares the call: the payment goes `pending`, the
   `PaymentTransaction` (with its derived provider key) and a
   `PaymentSettlement` row are inserted — so a process that dies during the
   call leaves a row a sweeper will find;
2. the call, with no transaction open;
3. one transaction records what the provider said, conditional on the
   payment still being `pending`, so whoever records first wins and every
   later recorder (a retry, the other process, a settlement attempt) changes
   nothing.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any, cast

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.db.models.functions import Now
from django.utils.module_loading import import_string

from core import due
from core.errors import ApplicationError, InvalidRequest
from core.money import check_currency, format_money, minor_units
from idempotency.failpoints import failpoint
from idempotency.outbox import outbox_write

from .event_types import PaymentEventType
from .gateway import Outcome, ProviderResult, get_gateway
from .keys import install_id, install_id_subquery, provider_key
from .lock_objects import payment_lock
from .models import (
    PAYMENT_TRANSITIONS,
    Payment,
    PaymentEvent,
    PaymentSettlement,
    PaymentStatus,
    PaymentTransaction,
    Refund,
    RefundStatus,
    TransactionKind,
    TransactionStatus,
)
from .provider_events import stored_capture_result, stored_refund_result

logger = logging.getLogger(__name__)

SUPPORTED_METHODS: frozenset[str] = frozenset(
    {"pm_card_ok", "pm_card_declined", "pm_card_timeout", "pm_card_unavailable"}
)


class PaymentReferenceConflict(ApplicationError):
    status = 409
    code = "payment_reference_conflict"
    title = "Payment reference conflict"


class InvalidPaymentTransition(ApplicationError):
    status = 409
    code = "invalid_payment_transition"
    title = "Invalid payment transition"


class TransactionOpen(RuntimeError):
    """A provider call was attempted inside a database transaction."""


@dataclass(frozen=True)
class CaptureResult:
    """What a capture came to: succeeded, declined (final) or unknown (being settled)."""

    outcome: Outcome
    payment: Payment
    detail: str = ""


def validate_payment_method(payment_method: str) -> str:
    """Refuse a payment method the provider does not know (400 `invalid_request`)."""
    if payment_method not in SUPPORTED_METHODS:
        raise InvalidRequest(
            f"Unknown payment method {payment_method!r}.",
            errors={"payment_method": [f"Must be one of {', '.join(sorted(SUPPORTED_METHODS))}."]},
        )
    return payment_method


def _require_no_transaction(what: str) -> None:
    if connection.in_atomic_block:
        raise TransactionOpen(f"{what} calls the provider: call it with no transaction open")


def _outcome_of(payment: Payment) -> Outcome:
    if payment.status in (
        PaymentStatus.CAPTURED,
        PaymentStatus.PARTIALLY_REFUNDED,
        PaymentStatus.REFUNDED,
    ):
        return Outcome.SUCCEEDED
    if payment.status == PaymentStatus.FAILED:
        return Outcome.DECLINED
    return Outcome.UNKNOWN


def _table(model) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def _transition(
    *,
    payment: Payment,
    to: str,
    detail: dict,
    increments: dict[str, Decimal] | None = None,
) -> Payment | None:
    """Move a payment to `to` if it is still in the status we read; write the event.

    One statement: the conditional UPDATE (amount columns grow by
    `increments`, in SQL) and the event INSERT fed by its RETURNING, so the
    event exists exactly when the change happened. Return the payment as
    updated, or None when another transaction moved it first (nothing written).
    """
    if to not in PAYMENT_TRANSITIONS[payment.status]:
        raise InvalidPaymentTransition(f"A payment cannot go from {payment.status} to {to}.")
    sets = ["status = %s", "updated_at = statement_timestamp()"]
    params: list = [to]
    for column, amount in (increments or {}).items():
        Payment._meta.get_field(column)  # only real columns reach the SQL
        sets.append(f"{column} = {column} + %s")
        params.append(amount)
    sql = (
        f"WITH moved AS (UPDATE {_table(Payment)} SET {', '.join(sets)}"
        "  WHERE id = %s AND status = %s RETURNING *),"
        f" event AS (INSERT INTO {_table(PaymentEvent)}"
        "  (payment_id, kind, from_status, to_status, detail)"
        "  SELECT id, 'transition', %s, %s, %s::jsonb FROM moved)"
        " SELECT * FROM moved"
    )
    params += [payment.id, payment.status, payment.status, to, json.dumps(detail)]
    moved = list(Payment.objects.raw(sql, params))
    return moved[0] if moved else None


# -- create ----------------------------------------------------------------------


def payment_create(
    *, reference: str, amount: Decimal, currency: str, payment_method: str, owner=None
) -> Payment:
    """Create the payment of one operation; the same reference returns the same payment.

    Call it inside the caller's transaction. The unique reference decides:
    a second call with the same parameters returns the first payment; with
    other parameters it is refused (409 `payment_reference_conflict`).
    """
    validate_payment_method(payment_method)
    check_currency(currency)
    places = minor_units(currency)
    # A non-finite amount is refused like any other (its exponent is a letter).
    if not amount.is_finite() or amount <= 0 or -cast(int, amount.as_tuple().exponent) > places:
        raise InvalidRequest(
            f"Invalid payment amount {amount}.", errors={"amount": ["Must be positive."]}
        )
    # Insert first; exactly the reference's unique constraint means "made already".
    # One statement (no savepoint): it commits or rolls back with the caller's transaction.
    sql = (
        f"INSERT INTO {_table(Payment)} (id, reference, owner_id, amount, currency,"
        " payment_method, status, amount_authorized, amount_captured, amount_refunded)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, 0, 0, 0)"
        " ON CONFLICT ON CONSTRAINT payments_payment_reference_uniq DO NOTHING RETURNING *"
    )
    owner_id = owner.pk if owner is not None else None
    params = [
        uuid.uuid4(),
        reference,
        owner_id,
        amount,
        currency,
        payment_method,
        PaymentStatus.NONE,
    ]
    created = list(Payment.objects.raw(sql, params))
    if created:
        return created[0]
    existing = Payment.objects.get(reference=reference)
    same = (existing.amount, existing.currency, existing.payment_method) == (
        amount,
        currency,
        payment_method,
    ) and existing.owner_id == owner_id
    if not same:
        raise PaymentReferenceConflict(f"Payment {reference!r} exists with other parameters.")
    return existing


# -- capture ---------------------------------------------------------------------


def _transaction_get_or_insert(
    *, payment: Payment, kind: str, key: str, amount: Decimal, first_attempt_in: float
) -> PaymentTransaction:
    """Insert the call's transaction row and its settlement row, or find the ones inserted before.

    Insert first: one statement inserts both, each under `ON CONFLICT ON
    CONSTRAINT <its unique constraint> DO NOTHING`, so exactly those
    constraints mean "already there" and any other violation still raises.
    The settlement row is what a sweeper finds if nobody records the outcome.
    """
    sql = (
        f"WITH txn AS (INSERT INTO {_table(PaymentTransaction)}"
        "  (payment_id, kind, provider_key, amount, currency, status, provider_operation_id,"
        "   last_error) VALUES (%s, %s, %s, %s, %s, %s, '', '')"
        "  ON CONFLICT ON CONSTRAINT payments_transaction_payment_kind_key_uniq DO NOTHING"
        "  RETURNING id),"
        f" settlement AS (INSERT INTO {_table(PaymentSettlement)}"
        "  (transaction_id, next_attempt_at, attempts, needs_attention, last_error)"
        "  SELECT id, statement_timestamp() + make_interval(secs => %s), 0, false, '' FROM txn"
        "  ON CONFLICT ON CONSTRAINT payments_settlement_transaction_uniq DO NOTHING)"
        " SELECT id FROM txn"
    )
    params: list[Any] = [
        payment.id,
        kind,
        key,
        amount,
        payment.currency,
        TransactionStatus.UNKNOWN,
        first_attempt_in,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is not None:
        return PaymentTransaction(
            id=row[0],
            payment=payment,
            kind=kind,
            provider_key=key,
            amount=amount,
            currency=payment.currency,
            status=TransactionStatus.UNKNOWN,
        )
    # Inserted by an earlier attempt (with its settlement row, in the same transaction).
    txn = PaymentTransaction.objects.get(payment=payment, kind=kind, provider_key=key)
    _settlement_insert(txn=txn, first_attempt_in=first_attempt_in)
    return txn


def _settlement_insert(*, txn: PaymentTransaction, first_attempt_in: float) -> None:
    """Leave the row a sweeper will find if nobody records this call's outcome (if missing)."""
    sql = (
        f"INSERT INTO {_table(PaymentSettlement)}"
        " (transaction_id, next_attempt_at, attempts, needs_attention, last_error)"
        " VALUES (%s, statement_timestamp() + make_interval(secs => %s), 0, false, '')"
        " ON CONFLICT ON CONSTRAINT payments_settlement_transaction_uniq DO NOTHING"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [txn.id, first_attempt_in])


@transaction.atomic
def _capture_begin(*, payment_id) -> tuple[Payment, PaymentTransaction] | CaptureResult:
    # The install id never changes once made: read it with the payment, in one statement.
    payment = Payment.objects.annotate(install=install_id_subquery()).get(id=payment_id)
    key = provider_key(
        install=payment.install or install_id(), reference=payment.reference, kind="capture"
    )
    if payment.status == PaymentStatus.NONE:
        if not _transition(payment=payment, to=PaymentStatus.PENDING, detail={"provider_key": key}):
            payment.refresh_from_db()
        else:
            payment.status = PaymentStatus.PENDING
    if payment.status != PaymentStatus.PENDING:
        return CaptureResult(outcome=_outcome_of(payment), payment=payment, detail="already final")
    txn = _transaction_get_or_insert(
        payment=payment,
        kind=TransactionKind.CAPTURE,
        key=key,
        amount=payment.amount,
        first_attempt_in=settings.PAYMENTS_SETTLE_GRACE,
    )
    return payment, txn


def payment_capture(*, payment_id) -> CaptureResult:
    """Take the payment's amount from its payment method, once.

    Must be called with no transaction open: it calls the provider. Any
    number of calls, from any number of processes, send the same derived
    key `<install id>:<reference>:capture`, so the provider charges at most
    once. An unknown outcome leaves the payment `pending` with a due
    settlement row; the settlement task finishes it. The settled handler is
    NOT called here: the caller acts on the returned outcome.
    """
    _require_no_transaction("payment_capture")
    begun = _capture_begin(payment_id=payment_id)
    if isinstance(begun, CaptureResult):
        return begun
    payment, txn = begun
    failpoint("payments.capture.before_provider")
    result = get_gateway().capture(
        key=txn.provider_key,
        amount=txn.amount,
        currency=txn.currency,
        reference=payment.reference,
        payment_method=payment.payment_method,
    )
    failpoint("payments.capture.after_provider")
    payment = _capture_record(transaction_id=txn.id, result=result, mode="inline", txn=txn)
    return CaptureResult(outcome=_outcome_of(payment), payment=payment, detail=result.describe())


def payment_lookup_once(*, payment_id) -> CaptureResult:
    """Ask the provider once what became of the payment's capture, and record a final answer.

    Must be called with no transaction open. Sends nothing new: a capture the
    provider never received stays `unknown` here (settlement re-sends it).
    The settled handler is NOT called here: the caller acts on the outcome.
    """
    _require_no_transaction("payment_lookup_once")
    payment = Payment.objects.get(id=payment_id)
    if payment.status != PaymentStatus.PENDING:
        return CaptureResult(outcome=_outcome_of(payment), payment=payment)
    txn = (
        PaymentTransaction.objects.filter(payment=payment, kind=TransactionKind.CAPTURE)
        .order_by("-id")
        .first()
    )
    if txn is None:
        return CaptureResult(outcome=Outcome.UNKNOWN, payment=payment, detail="no capture sent")
    result = get_gateway().lookup(key=txn.provider_key)
    if result.outcome == Outcome.NOT_FOUND:
        return CaptureResult(
            outcome=Outcome.UNKNOWN, payment=payment, detail="not found at the provider"
        )
    payment = _capture_record(transaction_id=txn.id, result=result, mode="lookup")
    return CaptureResult(outcome=_outcome_of(payment), payment=payment, detail=result.describe())


def _notify_settled(*, payment: Payment, outcome: Outcome) -> None:
    path = settings.PAYMENTS_SETTLED_HANDLER
    if path:
        import_string(path)(payment=payment, outcome=outcome)


def _mark_needs_attention(*, payment: Payment, txn: PaymentTransaction, reason: str) -> None:
    """Flag the call's settlement for staff and write the payment's event (payment locked)."""
    settlement_id = (
        PaymentSettlement.objects.filter(transaction=txn).values_list("id", flat=True).first()
    )
    if settlement_id is not None and due.flag_attention(
        PaymentSettlement, pk=settlement_id, reason=reason
    ):
        _attention_event(payment=payment, txn=txn, reason=reason)


def _attention_event(*, payment: Payment, txn: PaymentTransaction, reason: str) -> None:
    PaymentEvent.objects.create(
        payment_id=payment.id,
        kind="needs_attention",
        from_status=payment.status,
        to_status=payment.status,
        detail={"provider_key": txn.provider_key, "reason": reason},
    )
    logger.error("payment %s needs attention: %s", payment.reference, reason)


def _transaction_close(*, txn: PaymentTransaction, status: str, operation_id: str, error: str):
    """Record the call's final status and settle its settlement row, in one statement."""
    sql = (
        f"WITH txn AS (UPDATE {_table(PaymentTransaction)} SET status = %s,"
        "  provider_operation_id = %s, last_error = %s, updated_at = statement_timestamp()"
        "  WHERE id = %s RETURNING id)"
        f" UPDATE {_table(PaymentSettlement)} SET done_at = statement_timestamp(),"
        "  lease_owner = '', lease_expires_at = NULL, needs_attention = false,"
        "  updated_at = statement_timestamp()"
        " WHERE transaction_id IN (SELECT id FROM txn) AND done_at IS NULL"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [status, operation_id, error, txn.id])


@transaction.atomic
def _capture_record(
    *,
    transaction_id: int,
    result: ProviderResult,
    mode: str,
    txn: PaymentTransaction | None = None,
    attempt: due.Attempt | None = None,
) -> Payment:
    """Record one provider answer about a capture (mode: inline | lookup | settlement | webhook).

    A final answer is one conditional UPDATE of the payment (`pending` → the
    outcome; it takes the payment's row lock, as `payment_lock` would) with
    its event, then the transaction and settlement rows: the first recorder
    wins, every later one finds the payment no longer `pending` and changes
    nothing. `txn` spares the read when the caller has the row already.
    """
    if txn is None or txn.id != transaction_id:
        txn = PaymentTransaction.objects.get(id=transaction_id)
    final = {Outcome.SUCCEEDED: PaymentStatus.CAPTURED, Outcome.DECLINED: PaymentStatus.FAILED}
    mismatch = result.outcome == Outcome.SUCCEEDED and (result.amount, result.currency) != (
        txn.amount,
        txn.currency,
    )
    if result.outcome in final and not mismatch:
        detail = {"provider_key": txn.provider_key, "via": mode, "answer": result.describe()}
        captured = result.outcome == Outcome.SUCCEEDED
        payment = _transition(
            payment=Payment(id=txn.payment_id, status=PaymentStatus.PENDING),
            to=final[result.outcome],
            detail=detail,
            increments={"amount_authorized": txn.amount, "amount_captured": txn.amount}
            if captured
            else None,
        )
        if payment is None:
            # Recorded already (by the other process, the inline call, an earlier
            # attempt): the first recorder won; nothing changes twice.
            return Payment.objects.get(id=txn.payment_id)
        _transaction_close(
            txn=txn,
            status=TransactionStatus.SUCCEEDED if captured else TransactionStatus.DECLINED,
            operation_id=result.operation_id,
            error="" if captured else result.describe(),
        )
        if mode in ("settlement", "webhook"):
            _notify_settled(
                payment=payment, outcome=Outcome.SUCCEEDED if captured else Outcome.DECLINED
            )
        return payment
    payment = payment_lock(payment_id=txn.payment_id)
    if payment.status != PaymentStatus.PENDING:
        return payment
    if result.outcome not in final:
        # The provider's webhook may have come before the shop knew this call
        # (stored unmatched): record it now, through the same transition.

        stored = stored_capture_result(txn=txn)
        if stored is not None:
            return _capture_record(
                transaction_id=txn.id, result=stored, mode=mode, txn=txn, attempt=attempt
            )
    if mismatch:
        _mark_needs_attention(
            payment=payment,
            txn=txn,
            reason=f"provider captured {result.amount} {result.currency}, "
            f"shop asked {txn.amount} {txn.currency}",
        )
        return payment
    # Unknown: never treated as failed. The settlement row decides when to ask again.
    PaymentTransaction.objects.filter(id=txn.id).update(
        last_error=result.describe(), updated_at=Now()
    )
    settlements = PaymentSettlement.objects.filter(transaction=txn).pending()
    if mode == "inline":
        delay = settings.PAYMENTS_SETTLE_FIRST_DELAY
        settlements.update(
            next_attempt_at=Now() + timedelta(seconds=delay),
            last_error=due.truncate_error(result.describe()),
            updated_at=Now(),
        )
        ids = list(settlements.values_list("id", flat=True))
        due.ring_many_after_commit(PaymentSettlement, ids, delay=delay + 0.5)
    elif mode == "settlement":
        reason = (
            f"outcome still unknown after {settings.PAYMENTS_SETTLE_MAX_ATTEMPTS} "
            f"settlement attempts: {result.describe()}"
        )
        for settlement_id in settlements.values_list("id", flat=True):
            if due.attempt_failed(
                PaymentSettlement,
                pk=settlement_id,
                error=result.describe(),
                attention_reason=reason,
                # Fenced: a stale attempt's unknown answer spends nothing.
                attempt=attempt if attempt is not None and attempt.pk == settlement_id else None,
            ):
                _attention_event(payment=payment, txn=txn, reason=reason)
    return payment


# Keyed by the kind as stored (a plain str, equal to its TransactionKind).
_RECORDERS: dict[str, Callable[..., Payment]] = {TransactionKind.CAPTURE: _capture_record}


# -- settlement ------------------------------------------------------------------


def _settlement_begin_attempt(
    *, settlement_id: int
) -> tuple[PaymentSettlement, due.Attempt] | None:
    """Count one attempt and schedule the next before calling out; None if not due.

    `core.due.attempt_begin`: exactly one of several concurrent runners
    (sweeper, bell, redelivered message) takes the attempt, and it commits
    before the provider call, so a runner killed mid-call has already pushed
    `next_attempt_at` back by the backoff.
    """
    attempt = due.attempt_begin(PaymentSettlement, pk=settlement_id)
    if attempt.budget_spent:
        # The budget is spent whatever ended the earlier attempts (an unknown
        # answer, or a recorder or settled-handler that kept raising): staff
        # decide now, instead of an endless loop at the maximum backoff.
        _settlement_exhausted(settlement_id=settlement_id)
    if not attempt.taken:
        return None
    settlement = PaymentSettlement.objects.select_related("transaction__payment").get(
        id=settlement_id
    )
    return settlement, attempt


@transaction.atomic
def _settlement_exhausted(*, settlement_id: int) -> None:
    settlement = PaymentSettlement.objects.select_related("transaction").get(id=settlement_id)
    if settlement.done_at is not None or settlement.needs_attention:
        return
    txn = settlement.transaction
    payment = payment_lock(payment_id=txn.payment_id)
    _mark_needs_attention(
        payment=payment,
        txn=txn,
        reason=f"not settled after {settlement.attempts} attempts: {settlement.last_error}",
    )


def _resend(*, txn: PaymentTransaction, gateway) -> ProviderResult:
    payment = txn.payment
    if txn.kind == TransactionKind.CAPTURE:
        return gateway.capture(
            key=txn.provider_key,
            amount=txn.amount,
            currency=txn.currency,
            reference=payment.reference,
            payment_method=payment.payment_method,
        )
    raise NotImplementedError(f"no settlement for {txn.kind} transactions")


def payment_settle(*, settlement_id: int) -> PaymentSettlement:
    """Make one settlement attempt if it is due: find out what became of the call and record it.

    Must be called with no transaction open. Looks the call up by its
    provider key; if the provider never got it, sends it again under the same
    key. A final answer is recorded and `settings.PAYMENTS_SETTLED_HANDLER`
    is called inside that transaction; an unknown one waits for the next
    attempt (backoff with jitter, in the row) until the budget is spent and
    the row needs attention.
    """
    _require_no_transaction("payment_settle")
    begun = _settlement_begin_attempt(settlement_id=settlement_id)
    if begun is None:
        return PaymentSettlement.objects.get(id=settlement_id)
    settlement, attempt = begun
    txn = settlement.transaction
    gateway = get_gateway()
    result = gateway.lookup(key=txn.provider_key)
    failpoint("payments.settle.after_lookup")
    if result.outcome == Outcome.NOT_FOUND:
        # Never applied (lost before it arrived, or refused with a 503). The
        # provider's idempotency makes a re-send under the same key safe even
        # if the first call is still on its way.
        result = _resend(txn=txn, gateway=gateway)
    _RECORDERS[txn.kind](transaction_id=txn.id, result=result, mode="settlement", attempt=attempt)
    settlement.refresh_from_db()
    return settlement


def settlements_lease_due(*, limit: int = 100) -> list[int]:
    """Return ids of due settlements and lease them so the next sweep skips them."""
    return due.lease_due(PaymentSettlement, limit=limit)


@transaction.atomic
def settlement_retry_now(*, settlement_id: int, by=None) -> PaymentSettlement:
    """Give a settlement that needs attention a fresh attempt budget, due now (staff action)."""
    settlement = PaymentSettlement.objects.select_related("transaction").get(id=settlement_id)
    if due.retry_now(PaymentSettlement, pk=settlement_id):
        payment = Payment.objects.get(id=settlement.transaction.payment_id)
        PaymentEvent.objects.create(
            payment=payment,
            kind="retry",
            from_status=payment.status,
            to_status=payment.status,
            detail={
                "provider_key": settlement.transaction.provider_key,
                "by": getattr(by, "username", None),
            },
        )
    settlement.refresh_from_db()
    return settlement


# -- refunds ---------------------------------------------------------------------
#
# A refund is a due row (`Refund`, core.due) inserted with its amount reserved
# on the payment, in one transaction, before any provider call; the call runs
# in the `payments.refund` task with no transaction open; its answer (or a
# webhook's, or staff's) is recorded by ONE conditional transition of the
# refund row, so whoever records first wins and every later recorder changes
# nothing. docs/payments.md, "Refunds".

_REFUNDABLE_STATUSES = (PaymentStatus.CAPTURED, PaymentStatus.PARTIALLY_REFUNDED)
# The statuses a provider's answer may still settle: a refund flagged for staff
# (budget spent on unknown answers) is settled by the provider's late word too.
_OPEN_REFUND_STATUSES = ("pending", "needs_attention")


class RefundExceedsCaptured(ApplicationError):
    status = 422
    code = "refund_exceeds_captured"
    title = "Refund exceeds captured"


class RefundInvalidState(ApplicationError):
    status = 409
    code = "invalid_state"
    title = "Invalid state"


class RefundConflict(ApplicationError):
    status = 409
    code = "refund_conflict"
    title = "Refund conflict"


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
            f"Invalid refund amount {amount}.",
            errors={
                "amount": [f"Must be positive, with at most {minor_units(currency)} decimals."]
            },
        )


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

    One transaction (a savepoint inside the caller's): the refund row and its
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
        payment = Payment.objects.get(id=payment_id)
        _refund_amount_check(amount=amount, currency=payment.currency)
        sql = (
            f"WITH txn AS (INSERT INTO {_table(PaymentTransaction)}"
            "  (payment_id, kind, provider_key, amount, currency, status, provider_operation_id,"
            "   last_error) VALUES (%s, %s, %s, %s, %s, %s, '', '')"
            "  ON CONFLICT ON CONSTRAINT payments_transaction_payment_kind_key_uniq DO NOTHING"
            "  RETURNING id)"
            f" INSERT INTO {_table(Refund)} (id, payment_id, transaction_id, amount, currency,"
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
                raise RefundConflict(f"Refund {refund_id} exists for another payment.")
            return existing  # already requested: one refund per refund id
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {_table(Payment)} SET refund_reserved = refund_reserved + %s,"
                " updated_at = statement_timestamp()"
                " WHERE id = %s AND status = ANY(%s) AND refund_reserved + %s <= amount_captured",
                [amount, payment.id, list(_REFUNDABLE_STATUSES), amount],
            )
            reserved = cursor.rowcount == 1
        if not reserved:
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


class RefundBudgetMoved(Exception):
    """The budget changed under every try of `refund_request_capped`: transient, try later."""


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
    for _ in range(tries):
        existing = Refund.objects.filter(id=refund_id).first()
        if existing is not None:
            if existing.payment_id != payment_id:
                raise RefundConflict(f"Refund {refund_id} exists for another payment.")
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
            f"Nothing to refund: the payment is {payment.status}.",
            extra={"payment_status": payment.status},
        )
    left = refundable(payment=payment)
    text = format_money(left, payment.currency)
    raise RefundExceedsCaptured(
        f"At most {text} {payment.currency} can still be refunded (captured "
        f"{format_money(payment.amount_captured, payment.currency)}, refunded or being "
        f"refunded {format_money(payment.refund_reserved, payment.currency)}); "
        f"asked {format_money(amount, payment.currency)}.",
        errors={"amount": [f"At most {text} {payment.currency}."]},
        extra={"refundable": text, "currency": payment.currency},
    )


def _refund_event(*, payment_id, kind: str, detail: dict) -> None:
    status = Payment.objects.values_list("status", flat=True).get(id=payment_id)
    PaymentEvent.objects.create(
        payment_id=payment_id, kind=kind, from_status=status, to_status=status, detail=detail
    )


def _refund_succeed(
    *,
    refund_id,
    via: str,
    operation_id: str = "",
    outside: bool = False,
    by=None,
    from_statuses: tuple[str, ...] = _OPEN_REFUND_STATUSES,
) -> bool:
    """THE transition of a refund to succeeded; return True if this call made it.

    Conditional on the refund's status (first recorder wins, every other
    one updates nothing); the winner moves `amount_refunded += amount` (in
    SQL) and the payment's status with its event, and closes the call's
    transaction row, all in this transaction. The refund row is locked
    before the payment (the order `refund_request` takes them in).
    """
    with transaction.atomic():
        won = Refund.objects.filter(id=refund_id, status__in=from_statuses).update(
            status="succeeded",
            done_at=Now(),
            needs_attention=False,
            lease_owner="",
            lease_expires_at=None,
            outside_shop=outside,
            resolved_by=by if outside else None,
            updated_at=Now(),
        )
        if not won:
            return False
        refund = Refund.objects.select_related("transaction").get(id=refund_id)
        payment = payment_lock(payment_id=refund.payment_id)
        refunded = payment.amount_refunded + refund.amount
        to = (
            PaymentStatus.REFUNDED
            if refunded >= payment.amount_captured
            else PaymentStatus.PARTIALLY_REFUNDED
        )
        moved = _transition(
            payment=payment,
            to=to,
            detail={
                "refund_id": str(refund.id),
                "provider_key": refund.provider_key,
                "amount": str(refund.amount),
                "via": via,
                **({"by": getattr(by, "username", None)} if outside else {}),
            },
            increments={"amount_refunded": refund.amount},
        )
        if moved is None:  # cannot happen: the payment is locked
            raise InvalidPaymentTransition(f"payment {payment.id} moved under its lock")
        # The shopper's "refunded" mail (shop/emails.py), in the transaction that made it true.
        outbox_write(
            aggregate_type="payment",
            aggregate_id=str(payment.id),
            event_type=PaymentEventType.REFUND_SUCCEEDED,
            payload={
                "refund_id": str(refund.id),
                "payment_id": str(payment.id),
                "reference": payment.reference,  # "order-<number>": payments knows no orders
                "owner_id": payment.owner_id,
                "amount": format_money(refund.amount),
                "currency": refund.currency,
            },
        )
        txn = refund.transaction
        if outside:
            PaymentTransaction.objects.filter(id=txn.id).update(
                last_error="refunded outside the shop (staff)", updated_at=Now()
            )
        else:
            PaymentTransaction.objects.filter(id=txn.id).update(
                status=TransactionStatus.SUCCEEDED,
                provider_operation_id=operation_id[:64],
                last_error="",
                updated_at=Now(),
            )
    return True


def _refund_flag(
    *, refund_id, reason: str, txn_status: str | None = None, operation_id: str = ""
) -> bool:
    """Stop a pending refund for staff (`needs_attention`), keeping its reservation."""
    with transaction.atomic():
        flagged = Refund.objects.filter(id=refund_id, status="pending").update(
            status="needs_attention",
            needs_attention=True,
            last_error=due.truncate_error(reason),
            lease_owner="",
            lease_expires_at=None,
            updated_at=Now(),
        )
        if not flagged:
            return False
        refund = Refund.objects.get(id=refund_id)
        if txn_status is not None:
            PaymentTransaction.objects.filter(id=refund.transaction_id).update(
                status=txn_status,
                provider_operation_id=operation_id[:64],
                last_error=due.truncate_error(reason),
                updated_at=Now(),
            )
        _refund_event(
            payment_id=refund.payment_id,
            kind="needs_attention",
            detail={
                "refund_id": str(refund.id),
                "provider_key": refund.provider_key,
                "reason": reason,
            },
        )
        logger.error("refund %s needs attention: %s", refund.id, reason)
    return True


def _refund_record(
    *, refund, result: ProviderResult, mode: str, attempt: due.Attempt | None = None
) -> bool:
    """Record one provider answer about a refund (mode: task | webhook); True if it changed it.

    Success → the one transition to succeeded; decline (final) or another
    amount → needs attention; unknown → a stored webhook event for the key,
    if one came first, else the attempt failed (backoff, then attention).
    """
    describe = result.describe()
    if result.outcome == Outcome.SUCCEEDED:
        if (result.amount, result.currency) != (refund.amount, refund.currency):
            return _refund_flag(
                refund_id=refund.id,
                reason=f"provider refunded {result.amount} {result.currency}, "
                f"shop asked {refund.amount} {refund.currency}",
            )
        return _refund_succeed(refund_id=refund.id, via=mode, operation_id=result.operation_id)
    if result.outcome == Outcome.DECLINED:
        return _refund_flag(
            refund_id=refund.id,
            reason=f"the provider refused the refund: {describe}",
            txn_status=TransactionStatus.DECLINED,
            operation_id=result.operation_id,
        )
    with transaction.atomic():
        # Locked, so a webhook being applied right now is either seen or waits.
        current = Refund.objects.select_for_update().get(id=refund.id)
        if current.status not in _OPEN_REFUND_STATUSES:
            return False

        stored = stored_refund_result(refund=current)
        if stored is not None:
            return _refund_record(refund=current, result=stored, mode=mode, attempt=attempt)
        PaymentTransaction.objects.filter(id=current.transaction_id).update(
            last_error=describe, updated_at=Now()
        )
        if mode != "task" or current.status != "pending":
            return False
        budget = settings.PAYMENTS_REFUND_MAX_ATTEMPTS
        reason = f"refund outcome still unknown after {budget} attempts: {describe}"
        # Fenced: a stale attempt (its lease ran out, another attempt began)
        # neither frees the running attempt's lease nor spends the budget.
        if due.attempt_failed(
            Refund, pk=current.id, error=describe, attention_reason=reason, attempt=attempt
        ):
            Refund.objects.filter(id=current.id, status="pending").update(
                needs_attention=False
            )  # let _refund_flag make the one status change with its event
            _refund_flag(refund_id=current.id, reason=reason)
    return False


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
        raise RefundInvalidState("The payment has no succeeded capture to refund.")
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
    _require_no_transaction("refund_run")
    attempt = due.attempt_begin(Refund, pk=refund_id)
    if attempt.budget_spent:
        _refund_flag(
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
    _refund_record(refund=refund, result=result, mode="task", attempt=attempt)
    return Refund.objects.get(id=refund_id)


def refund_record_outside(*, refund_id, by=None) -> bool:
    """Staff: the money went back outside the shop; record the refund as succeeded, once.

    Only a refund in `needs_attention`; the same conditional transition as
    the provider's answer (`amount_refunded` moves), without calling the
    provider. A second click finds it succeeded and changes nothing (False).
    """
    return _refund_succeed(
        refund_id=refund_id, via="staff", outside=True, by=by, from_statuses=("needs_attention",)
    )


def refund_record_failed(*, refund_id, by=None) -> bool:
    """Staff: this refund will not happen; `failed`, and its reserved amount is released, once.

    Only a refund in `needs_attention` (conditional transition; a second
    click changes nothing). The released amount is refundable again (by a
    new refund id).
    """
    with transaction.atomic():
        changed = Refund.objects.filter(id=refund_id, status="needs_attention").update(
            status="failed",
            done_at=Now(),
            needs_attention=False,
            resolved_by=by,
            lease_owner="",
            lease_expires_at=None,
            updated_at=Now(),
        )
        if not changed:
            return False
        refund = Refund.objects.get(id=refund_id)
        payment_lock(payment_id=refund.payment_id)
        Payment.objects.filter(id=refund.payment_id).update(
            refund_reserved=F("refund_reserved") - refund.amount, updated_at=Now()
        )
        _refund_event(
            payment_id=refund.payment_id,
            kind="refund_failed",
            detail={
                "refund_id": str(refund.id),
                "amount": str(refund.amount),
                "by": getattr(by, "username", None),
            },
        )
    return True


def refund_retry_now(*, refund_id, by=None) -> bool:
    """Staff: put a refund that needs attention back to pending, due now (fresh budget)."""
    with transaction.atomic():
        reopened = Refund.objects.filter(id=refund_id, status="needs_attention").update(
            status="pending"
        )
        if not reopened or not due.retry_now(Refund, pk=refund_id):
            return False
        refund = Refund.objects.get(id=refund_id)
        _refund_event(
            payment_id=refund.payment_id,
            kind="retry",
            detail={"refund_id": str(refund.id), "by": getattr(by, "username", None)},
        )
    return True


# -- the provider's late word after a staff decision --------------------------------------
#
# Staff decided a refund that needed attention ("Refunded outside the shop" →
# succeeded with `outside_shop`; "Record as failed" → failed, its reservation
# released), and then the provider reports that it refunded it after all. The
# refund keeps its status and becomes a needs-attention item (`needs_attention`
# with the reason in `last_error`), with an event on the payment; reconciliation
# flags it (`refund_after_decision`) until staff take "Accept the provider's
# refund" (`refund_accept_provider`), the one action that ends it.

LATE_AFTER_OUTSIDE = "the provider reports a refund that was recorded as outside the shop"
LATE_AFTER_FAILED = "the provider reports a refund that was recorded as failed"


def _reserve_again(*, payment_id, amount: Decimal) -> bool:
    """Hold `amount` of the budget again (the same conditional UPDATE as a request)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_table(Payment)} SET refund_reserved = refund_reserved + %s,"
            " updated_at = statement_timestamp()"
            " WHERE id = %s AND status = ANY(%s) AND refund_reserved + %s <= amount_captured",
            [amount, payment_id, list(_REFUNDABLE_STATUSES), amount],
        )
        return cursor.rowcount == 1


def refund_late_success(*, refund_id, operation_id: str = "", via: str = "webhook") -> bool:
    """The provider reports a refund succeeded that staff recorded outside the shop / failed.

    Returns True if this call flagged it (once: a flagged refund is not
    flagged again). For a refund recorded failed, its amount is held in the
    budget again at once when it still fits (conditional UPDATE), so no new
    refund can pay the same money twice; when it no longer fits, the shopper
    was refunded twice and the reason says so.
    """
    with transaction.atomic():
        refund = Refund.objects.select_for_update().get(id=refund_id)
        if refund.needs_attention:
            return False
        if refund.status == RefundStatus.SUCCEEDED and refund.outside_shop:
            reason = f"{LATE_AFTER_OUTSIDE}: the shopper was refunded twice"
            held = True
        elif refund.status == RefundStatus.FAILED:
            payment_lock(payment_id=refund.payment_id)
            held = _reserve_again(payment_id=refund.payment_id, amount=refund.amount)
            reason = LATE_AFTER_FAILED + (
                ": its amount is held in the refund budget again"
                if held
                else ": the budget was used again since, so the shopper was refunded twice"
            )
        else:
            return False
        Refund.objects.filter(id=refund.id).update(
            needs_attention=True, last_error=due.truncate_error(reason), updated_at=Now()
        )
        # The provider's fact on the call's own row (what reconciliation compares).
        PaymentTransaction.objects.filter(id=refund.transaction_id).update(
            status=TransactionStatus.SUCCEEDED,
            provider_operation_id=operation_id[:64],
            last_error=due.truncate_error(reason),
            updated_at=Now(),
        )
        _refund_event(
            payment_id=refund.payment_id,
            kind="late_provider_refund",
            detail={
                "refund_id": str(refund.id),
                "provider_key": refund.provider_key,
                "amount": str(refund.amount),
                "recorded": "outside_shop" if refund.outside_shop else refund.status,
                "held": held,
                "via": via,
                "reason": reason,
            },
        )
        logger.error("refund %s needs attention: %s", refund.id, reason)
    return True


def refund_accept_provider(*, refund_id, by=None) -> bool:
    """Staff: accept the provider's late refund of a refund they had decided; once.

    Recorded outside the shop: the provider's refund becomes the record
    (`outside_shop` cleared: the outside payment was recovered or accepted as
    a loss, as the event says). Recorded failed: the refund becomes
    succeeded and counts as refunded (its amount was held again, or is held
    now if it fits); if the budget has no room any more, the double refund
    is acknowledged and the refund stays failed. Returns True if this call
    ended the item; a second click finds nothing flagged (False).
    """
    with transaction.atomic():
        refund = Refund.objects.select_for_update().get(id=refund_id)
        if not refund.needs_attention or refund.status not in (
            RefundStatus.SUCCEEDED,
            RefundStatus.FAILED,
        ):
            return False
        who = getattr(by, "username", None)
        detail = {"refund_id": str(refund.id), "amount": str(refund.amount), "by": who}
        if refund.status == RefundStatus.SUCCEEDED:
            Refund.objects.filter(id=refund.id).update(
                needs_attention=False,
                last_error="",
                outside_shop=False,
                resolved_by=by,
                updated_at=Now(),
            )
            _refund_event(
                payment_id=refund.payment_id,
                kind="late_provider_refund_accepted",
                detail={**detail, "outcome": "provider refund kept; outside payment settled"},
            )
            return True
        payment = payment_lock(payment_id=refund.payment_id)
        held = PaymentEvent.objects.filter(
            payment_id=refund.payment_id,
            kind="late_provider_refund",
            detail__refund_id=str(refund.id),
            detail__held=True,
        ).exists() or _reserve_again(payment_id=payment.id, amount=refund.amount)
        if held:
            _refund_succeed(refund_id=refund.id, via="staff", from_statuses=("failed",))
            Refund.objects.filter(id=refund.id).update(resolved_by=by, last_error="")
            outcome = "booked as refunded"
        else:
            Refund.objects.filter(id=refund.id).update(
                needs_attention=False, resolved_by=by, updated_at=Now()
            )
            outcome = "double refund acknowledged; the refund stays failed"
        _refund_event(
            payment_id=refund.payment_id,
            kind="late_provider_refund_accepted",
            detail={**detail, "outcome": outcome},
        )
    return True
