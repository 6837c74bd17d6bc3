"""The capture at checkout: create the payment, take its amount from the provider, once.

The rule that shapes it: never call the provider inside a database
transaction. A capture is three steps:

1. one transaction prepares the call: the payment goes `pending`, the
   `PaymentTransaction` (with its derived provider key) and a
   `PaymentSettlement` row are inserted — so a process that dies during the
   call leaves a row a sweeper will find (`payments.settlement`);
2. the call, with no transaction open;
3. the answer is recorded by the one conditional transition
   (`payments.recording.capture_record`), so whoever records first wins and
   every later recorder (a retry, the other process, a settlement attempt,
   a webhook) changes nothing.

At checkout the steps ride in the caller's transactions instead of their
own: `payment_prepare` (step 1, inside the transaction that creates the
payment), `payment_capture_send` (step 2), `payment_capture_record` (step
3, inside the transaction that applies the answer). `payment_capture` runs
all three itself (a retry, the completer, a confirm).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, cast

from django.conf import settings
from django.db import connection, transaction

from core import rows
from core.errors import InvalidRequest
from core.money import check_currency, minor_units
from idempotency.failpoints import failpoint

from .errors import PaymentReferenceConflict, require_no_transaction
from .gateway import Outcome, ProviderResult, get_gateway
from .keys import install_id, install_id_subquery, provider_key
from .models import (
    Payment,
    PaymentEvent,
    PaymentInstallation,
    PaymentSettlement,
    PaymentStatus,
    PaymentTransaction,
    TransactionKind,
    TransactionStatus,
)
from .recording import capture_record
from .transitions import payment_transition, sql_table

SUPPORTED_METHODS: frozenset[str] = frozenset(
    {"pm_card_ok", "pm_card_declined", "pm_card_timeout", "pm_card_unavailable"}
)


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


# -- create ----------------------------------------------------------------------


def _check_request(*, amount: Decimal, currency: str, payment_method: str) -> None:
    validate_payment_method(payment_method)
    check_currency(currency)
    places = minor_units(currency)
    # A non-finite amount is refused like any other (its exponent is a letter).
    if not amount.is_finite() or amount <= 0 or -cast(int, amount.as_tuple().exponent) > places:
        raise InvalidRequest(
            f"Invalid payment amount {amount}.", errors={"amount": ["Must be positive."]}
        )


def payment_create(
    *, reference: str, amount: Decimal, currency: str, payment_method: str, owner=None
) -> Payment:
    """Create the payment of one operation; the same reference returns the same payment.

    Call it inside the caller's transaction. The unique reference decides:
    a second call with the same parameters returns the first payment; with
    other parameters it is refused (409 `payment_reference_conflict`).
    """
    _check_request(amount=amount, currency=currency, payment_method=payment_method)
    # Insert first; exactly the reference's unique constraint means "made already".
    # One statement (no savepoint): it commits or rolls back with the caller's transaction.
    sql = (
        f"INSERT INTO {sql_table(Payment)} (id, reference, owner_id, amount, currency,"
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
    created = rows.raw(Payment, sql, params)
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


@dataclass(frozen=True)
class PreparedCapture:
    """A capture made ready inside the caller's transaction: the payment (`pending`) and
    the call's transaction row (with its settlement row), to send once that commits."""

    payment: Payment
    txn: PaymentTransaction


def payment_prepare(
    *,
    payment_id: uuid.UUID,
    reference: str,
    amount: Decimal,
    currency: str,
    payment_method: str,
    owner=None,
) -> PreparedCapture | Payment:
    """Create the payment already prepared for its capture, in the caller's transaction.

    The capture's first step (`payment_capture`, step 1) folded into the
    creation: one statement inserts the payment `pending` with its
    `none` → `pending` event, the capture's transaction row under its derived
    provider key and the settlement row a sweeper finds if nobody records the
    outcome. Once the caller commits, `payment_capture_send` makes the call
    and `payment_capture_record` records it (docs/payments.md, "Capture, step
    by step"). An installation without its id yet makes it first
    (`install_id`) and inserts again; a reference that exists already takes
    the long way: `payment_create`, and the returned payment is captured by
    `payment_capture`. `payment_id` is the new payment's id (a row that
    already references it may be written first in the transaction).
    """
    _check_request(amount=amount, currency=currency, payment_method=payment_method)
    installation = sql_table(PaymentInstallation)
    sql = (
        f"WITH install AS (SELECT install_id FROM {installation} WHERE id = 1),"
        f" payment AS (INSERT INTO {sql_table(Payment)} (id, reference, owner_id, amount,"
        "  currency, payment_method, status, amount_authorized, amount_captured,"
        "  amount_refunded) SELECT %s, %s, %s, %s, %s, %s, %s, 0, 0, 0 FROM install"
        "  ON CONFLICT ON CONSTRAINT payments_payment_reference_uniq DO NOTHING RETURNING *),"
        # The provider key of `payments.keys.provider_key`, derived in the statement.
        " keyed AS (SELECT payment.id, install.install_id || ':' || payment.reference"
        "  || ':' || %s AS provider_key FROM payment, install),"
        f" event AS (INSERT INTO {sql_table(PaymentEvent)}"
        "  (payment_id, kind, from_status, to_status, detail)"
        "  SELECT id, 'transition', %s, %s, jsonb_build_object('provider_key', provider_key)"
        "  FROM keyed),"
        f" txn AS (INSERT INTO {sql_table(PaymentTransaction)}"
        "  (payment_id, kind, provider_key, amount, currency, status, provider_operation_id,"
        "   last_error) SELECT id, %s, provider_key, %s, %s, %s, '', '' FROM keyed"
        "  RETURNING id, provider_key),"
        f" settlement AS (INSERT INTO {sql_table(PaymentSettlement)}"
        "  (transaction_id, next_attempt_at, attempts, needs_attention, last_error)"
        "  SELECT id, statement_timestamp() + make_interval(secs => %s), 0, false, ''"
        "  FROM txn)"
        " SELECT payment.*, txn.id AS capture_txn_id, txn.provider_key AS capture_key"
        " FROM payment, txn"
    )
    owner_id = owner.pk if owner is not None else None
    params: list[Any] = [
        payment_id,
        reference,
        owner_id,
        amount,
        currency,
        payment_method,
        PaymentStatus.PENDING,
        TransactionKind.CAPTURE,
        PaymentStatus.NONE,
        PaymentStatus.PENDING,
        TransactionKind.CAPTURE,
        amount,
        currency,
        TransactionStatus.UNKNOWN,
        settings.PAYMENTS_SETTLE_GRACE,
    ]
    prepared = rows.raw(Payment, sql, params)
    if not prepared:
        install_id()  # the installation's first payment makes its id (no-op after)
        prepared = rows.raw(Payment, sql, params)
    if not prepared:
        return payment_create(
            reference=reference,
            amount=amount,
            currency=currency,
            payment_method=payment_method,
            owner=owner,
        )
    payment = prepared[0]
    txn = PaymentTransaction(
        id=payment.capture_txn_id,  # type: ignore[attr-defined]
        payment=payment,
        kind=TransactionKind.CAPTURE,
        provider_key=payment.capture_key,  # type: ignore[attr-defined]
        amount=amount,
        currency=currency,
        status=TransactionStatus.UNKNOWN,
    )
    return PreparedCapture(payment=payment, txn=txn)


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
        f"WITH txn AS (INSERT INTO {sql_table(PaymentTransaction)}"
        "  (payment_id, kind, provider_key, amount, currency, status, provider_operation_id,"
        "   last_error) VALUES (%s, %s, %s, %s, %s, %s, '', '')"
        "  ON CONFLICT ON CONSTRAINT payments_transaction_payment_kind_key_uniq DO NOTHING"
        "  RETURNING id),"
        f" settlement AS (INSERT INTO {sql_table(PaymentSettlement)}"
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
        f"INSERT INTO {sql_table(PaymentSettlement)}"
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
        if not payment_transition(
            payment=payment, to=PaymentStatus.PENDING, detail={"provider_key": key}
        ):
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
    require_no_transaction("payment_capture")
    begun = _capture_begin(payment_id=payment_id)
    if isinstance(begun, CaptureResult):
        return begun
    payment, txn = begun
    result = payment_capture_send(capture=PreparedCapture(payment=payment, txn=txn))
    payment = capture_record(transaction_id=txn.id, result=result, mode="inline", txn=txn)
    return CaptureResult(outcome=_outcome_of(payment), payment=payment, detail=result.describe())


def payment_capture_send(*, capture: PreparedCapture) -> ProviderResult:
    """Send a prepared capture to the provider (step 2) and return its answer, unrecorded.

    Must be called with no transaction open. The caller records the answer
    (`payment_capture_record`, or `capture_record` in a transaction of its own).
    """
    require_no_transaction("payment_capture_send")
    failpoint("payments.capture.before_provider")
    result = get_gateway().capture(
        key=capture.txn.provider_key,
        amount=capture.txn.amount,
        currency=capture.txn.currency,
        reference=capture.payment.reference,
        payment_method=capture.payment.payment_method,
    )
    failpoint("payments.capture.after_provider")
    return result


def payment_capture_record(*, capture: PreparedCapture, result: ProviderResult) -> CaptureResult:
    """Record a sent capture's answer (step 3) in the caller's transaction.

    The payment returned is locked by that transaction, as last committed
    (`capture_record`): the caller may apply it to what it pays for without
    reading it again.
    """
    txn = capture.txn
    payment = capture_record(transaction_id=txn.id, result=result, mode="inline", txn=txn)
    return CaptureResult(outcome=_outcome_of(payment), payment=payment, detail=result.describe())


def payment_lookup_once(*, payment_id) -> CaptureResult:
    """Ask the provider once what became of the payment's capture, and record a final answer.

    Must be called with no transaction open. Sends nothing new: a capture the
    provider never received stays `unknown` here (settlement re-sends it).
    The settled handler is NOT called here: the caller acts on the outcome.
    """
    require_no_transaction("payment_lookup_once")
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
    payment = capture_record(transaction_id=txn.id, result=result, mode="lookup")
    return CaptureResult(outcome=_outcome_of(payment), payment=payment, detail=result.describe())
