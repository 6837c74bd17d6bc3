"""Recording a provider's answer: the one conditional transition per call, whoever brings it.

A capture's answer comes from the inline call (`payments.capture`), a
settlement attempt (`payments.settlement`) or a webhook (`payments.webhooks`);
a refund's from the `payments.refund` task (`payments.refunds`), a webhook or
staff. Every one of them records it here, by ONE conditional transition:

- a capture: `capture_record` moves the payment `pending` → captured/failed
  (`UPDATE … WHERE status = 'pending'`, `payments.transitions`);
- a refund: `refund_succeed` (open → succeeded) or `refund_flag`
  (pending → needs attention), each an `UPDATE … WHERE status IN (…)`.

So whoever records first wins and every later recorder changes nothing. An
unknown answer is never treated as failed: the call's due row decides when
to ask again, and a stored `unmatched` webhook event for the call's key
(`payments.provider_events`) is its answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models.functions import Now
from django.utils.module_loading import import_string

from core import due
from core.money import format_money
from idempotency.messaging.outbox import outbox_write

from .errors import InvalidPaymentTransition
from .event_types import PaymentEventType
from .gateway import Outcome, ProviderResult
from .lock_objects import payment_lock
from .models import (
    Payment,
    PaymentEvent,
    PaymentSettlement,
    PaymentStatus,
    PaymentTransaction,
    Refund,
    TransactionKind,
    TransactionStatus,
)
from .provider_events import stored_capture_result, stored_refund_result
from .transitions import payment_transition, sql_table

logger = logging.getLogger(__name__)

# What a capture came to (`payments.capture.CaptureResult`, the settled handler's `outcome`).

# The statuses a provider's answer may still settle: a refund flagged for staff
# (budget spent on unknown answers) is settled by the provider's late word too.
_OPEN_REFUND_STATUSES = ("pending", "needs_attention")


# -- captures --------------------------------------------------------------------


def _notify_settled(*, payment: Payment, outcome: Outcome) -> None:
    path = settings.PAYMENTS_SETTLED_HANDLER
    if path:
        import_string(path)(payment=payment, outcome=outcome)


def mark_needs_attention(*, payment: Payment, txn: PaymentTransaction, reason: str) -> None:
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


def _transaction_close_sql(
    *, txn: PaymentTransaction, status: str, operation_id: str, error: str
) -> tuple[str, list]:
    """The common table expressions that record the call's final status and settle its
    settlement row, written only when the payment's transition (`moved`) happened."""
    sql = (
        f"closed AS (UPDATE {sql_table(PaymentTransaction)} SET status = %s,"
        "  provider_operation_id = %s, last_error = %s, updated_at = statement_timestamp()"
        "  WHERE id = %s AND EXISTS (SELECT 1 FROM moved) RETURNING id),"
        f" settled AS (UPDATE {sql_table(PaymentSettlement)} SET done_at = statement_timestamp(),"
        "  lease_owner = '', lease_expires_at = NULL, needs_attention = false,"
        "  updated_at = statement_timestamp()"
        "  WHERE transaction_id IN (SELECT id FROM closed) AND done_at IS NULL)"
    )
    return sql, [status, operation_id, error, txn.id]


def _transaction_close(*, txn: PaymentTransaction, status: str, operation_id: str, error: str):
    """Record the call's final status and settle its settlement row, in one statement."""
    close, params = _transaction_close_sql(
        txn=txn, status=status, operation_id=operation_id, error=error
    )
    with connection.cursor() as cursor:
        cursor.execute(f"WITH moved AS (SELECT 1), {close} SELECT 1", params)


@transaction.atomic
def capture_record(
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
    The payment returned is locked by this transaction (by the UPDATE, or
    `payment_lock`), as last committed: a caller inside a transaction may
    apply it without reading it again.
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
        # The call's row and its settlement row close in the transition's statement.
        payment = payment_transition(
            payment=Payment(id=txn.payment_id, status=PaymentStatus.PENDING),
            to=final[result.outcome],
            detail=detail,
            increments={"amount_authorized": txn.amount, "amount_captured": txn.amount}
            if captured
            else None,
            also=_transaction_close_sql(
                txn=txn,
                status=TransactionStatus.SUCCEEDED if captured else TransactionStatus.DECLINED,
                operation_id=result.operation_id,
                error="" if captured else result.describe(),
            ),
        )
        if payment is None:
            # Recorded already (by the other process, the inline call, an earlier
            # attempt): the first recorder won; nothing changes twice.
            return payment_lock(payment_id=txn.payment_id)
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
            return capture_record(
                transaction_id=txn.id, result=stored, mode=mode, txn=txn, attempt=attempt
            )
    if mismatch:
        # Kept for staff's exits (`payments.capture_differs`): the provider's
        # record under a key never changes, so every recorder writes the same.
        PaymentSettlement.objects.filter(transaction=txn, done_at__isnull=True).update(
            provider_amount=result.amount, provider_currency=result.currency or ""
        )
        PaymentTransaction.objects.filter(id=txn.id).update(
            provider_operation_id=result.operation_id[:64], updated_at=Now()
        )
        mark_needs_attention(
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


def capture_record_differing(
    *, payment: Payment, txn: PaymentTransaction, amount, operation_id: str, by=None
) -> Payment | None:
    """Record, by staff's decision, that the provider captured `amount`, not the one asked.

    Called with the payment locked and `pending` (`payments.capture_differs`).
    The same conditional transition as every other recorder (`pending` →
    captured; a payment no longer pending: None, nothing written), with
    `capture_differs` set first so the database accepts a capture above the
    amount asked; the call's row takes the provider's amount (what moved, as
    reconciliation compares it), its settlement ends, and the settled handler
    moves the order, all in the caller's transaction.
    """
    Payment.objects.filter(id=payment.id, status=PaymentStatus.PENDING).update(
        capture_differs=True, updated_at=Now()
    )
    moved = payment_transition(
        payment=Payment(id=payment.id, status=PaymentStatus.PENDING),
        to=PaymentStatus.CAPTURED,
        detail={
            "provider_key": txn.provider_key,
            "via": "staff",
            "asked": str(txn.amount),
            "captured": str(amount),
            "by": getattr(by, "username", None),
        },
        increments={"amount_authorized": amount, "amount_captured": amount},
    )
    if moved is None:
        return None
    PaymentTransaction.objects.filter(id=txn.id).update(amount=amount)
    _transaction_close(
        txn=txn, status=TransactionStatus.SUCCEEDED, operation_id=operation_id, error=""
    )
    _notify_settled(payment=moved, outcome=Outcome.SUCCEEDED)
    return moved


# Keyed by the kind as stored (a plain str, equal to its TransactionKind).
RECORDERS: dict[str, Callable[..., Payment]] = {TransactionKind.CAPTURE: capture_record}


# -- refunds ---------------------------------------------------------------------


def refund_event(*, payment_id, kind: str, detail: dict) -> None:
    status = Payment.objects.values_list("status", flat=True).get(id=payment_id)
    PaymentEvent.objects.create(
        payment_id=payment_id, kind=kind, from_status=status, to_status=status, detail=detail
    )


def refund_succeed(
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
        moved = payment_transition(
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
            refund_call_close(
                transaction_id=txn.id, status=TransactionStatus.SUCCEEDED, operation_id=operation_id
            )
    return True


def refund_call_close(
    *, transaction_id: int, status: str, operation_id: str, error: str = ""
) -> None:
    """Write the provider's word on a refund's call row (what reconciliation compares)."""
    PaymentTransaction.objects.filter(id=transaction_id).update(
        status=status,
        provider_operation_id=operation_id[:64],
        last_error=due.truncate_error(error),
        updated_at=Now(),
    )


def refund_flag(
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
            refund_call_close(
                transaction_id=refund.transaction_id,
                status=txn_status,
                operation_id=operation_id,
                error=reason,
            )
        refund_event(
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


def refund_record(
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
            return refund_flag(
                refund_id=refund.id,
                reason=f"provider refunded {result.amount} {result.currency}, "
                f"shop asked {refund.amount} {refund.currency}",
            )
        return refund_succeed(refund_id=refund.id, via=mode, operation_id=result.operation_id)
    if result.outcome == Outcome.DECLINED:
        return refund_flag(
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
            return refund_record(refund=current, result=stored, mode=mode, attempt=attempt)
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
            )  # let refund_flag make the one status change with its event
            refund_flag(refund_id=current.id, reason=reason)
    return False
