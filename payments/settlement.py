"""Settling a capture whose answer was lost: look it up by its key, re-send, record; attempts.

A capture that got no final answer (a timeout, a process killed mid-call)
leaves a due `PaymentSettlement` row (`core.due`). Each attempt is taken by
exactly one runner (the sweeper, the bell, a redelivered message), looks the
call up by its provider key, re-sends it under the same key if the provider
never got it, and records the answer through the one conditional transition
(`payments.recording`). An attempt budget spent on unknown answers makes the
row need attention; staff give it a fresh budget (`settlement_retry_now`).
"""

from __future__ import annotations

from django.db import transaction

from core import due
from idempotency.failpoints import failpoint

from .errors import require_no_transaction
from .gateway import Outcome, ProviderResult, get_gateway
from .lock_objects import payment_lock
from .models import Payment, PaymentEvent, PaymentSettlement, PaymentTransaction, TransactionKind
from .recording import RECORDERS, mark_needs_attention


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
    mark_needs_attention(
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
    require_no_transaction("payment_settle")
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
    RECORDERS[txn.kind](transaction_id=txn.id, result=result, mode="settlement", attempt=attempt)
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
