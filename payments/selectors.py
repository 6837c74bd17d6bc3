"""Reads of the payments app."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, Q, QuerySet, Sum

from core import attention
from core.errors import NotFound

from .models import (
    Payment,
    PaymentInstallation,
    PaymentSettlement,
    PaymentTransaction,
    Refund,
    RefundStatus,
)
from .states import SettlementAttention


def payment_get(*, payment_id) -> Payment:
    """Return one payment, or raise not_found."""
    payment = Payment.objects.filter(id=payment_id).first()
    if payment is None:
        raise NotFound(f"No payment {payment_id}.")
    return payment


def payment_get_by_reference(*, reference: str) -> Payment | None:
    """Return the payment of an operation (e.g. "order-42"), if there is one."""
    return Payment.objects.filter(reference=reference).first()


def refunds_of_payment(*, payment_id) -> QuerySet[Refund]:
    """A payment's refunds, oldest first, whatever started them (goodwill, return, cancellation).

    No payment (a free order): none.
    """
    if payment_id is None:
        return Refund.objects.none()
    return Refund.objects.filter(payment_id=payment_id).order_by("created_at", "id")


def refund_get_or_none(*, refund_id) -> Refund | None:
    """One refund by its id, or None."""
    return Refund.objects.filter(id=refund_id).first()


def payment_get_or_none(*, payment_id) -> Payment | None:
    """One payment by its id, or None."""
    return Payment.objects.filter(id=payment_id).first()


def payment_has_refund_needing_attention(*, payment_id) -> bool:
    """Whether a refund of the payment waits for staff (it may wait long)."""
    return Refund.objects.filter(payment_id=payment_id, needs_attention=True).exists()


def install_id_or_none() -> str | None:
    """Return the installation id if it was ever created (a read: creates nothing)."""
    return PaymentInstallation.objects.filter(id=1).values_list("install_id", flat=True).first()


def settlements_needing_attention() -> QuerySet[PaymentSettlement]:
    """Settlements that ran out of attempts (or met a contradiction) and wait for staff."""
    return PaymentSettlement.objects.filter(
        done_at__isnull=True, needs_attention=True
    ).select_related("transaction__payment")


def transactions_with_key_prefix(*, key_prefix: str) -> QuerySet[PaymentTransaction]:
    """Every provider call of this installation, with its payment."""
    return PaymentTransaction.objects.filter(provider_key__startswith=key_prefix).select_related(
        "payment"
    )


def refunds_needing_attention() -> QuerySet[Refund]:
    """Refunds waiting for staff: `needs_attention`, or flagged (the reason in `last_error`)."""
    return Refund.objects.filter(
        # A decided refund (done) flagged again: the provider's late refund (refund_decisions).
        Q(status=RefundStatus.NEEDS_ATTENTION) | Q(needs_attention=True)
    )


def needs_attention_counts() -> dict[str, int]:
    """{kind: rows} for this app's kinds of "Needs attention" (settlement, refund)."""
    return {
        attention.SETTLEMENT: settlements_needing_attention().count(),
        attention.REFUND: refunds_needing_attention().count(),
    }


def needs_attention_items(*, limit: int = attention.PAGE_LIMIT) -> list[attention.AttentionItem]:
    """This app's items waiting for a person, oldest first per kind (the admin's list)."""
    items = []
    for settlement in attention.with_age(settlements_needing_attention())[:limit]:
        txn = settlement.transaction
        items.append(
            attention.AttentionItem(
                kind=attention.SETTLEMENT,
                pk=str(settlement.pk),
                what=f"settlement of {txn.kind} {txn.amount} {txn.currency} "
                f"({settlement.attempts} attempts)",
                reason=settlement.last_error,
                age=settlement.waiting,
                state=attention.row_state(settlement),
                status=settlement_attention(settlement=settlement),
                payment_id=txn.payment_id,
            )
        )
    for refund in attention.with_age(refunds_needing_attention())[:limit]:
        items.append(
            attention.AttentionItem(
                kind=attention.REFUND,
                pk=str(refund.pk),
                what=f"refund {refund.amount} {refund.currency} ({refund.origin}, {refund.status})",
                reason=refund.last_error,
                age=refund.waiting,
                state=attention.row_state(refund),
                status=refund.status,
                payment_id=refund.payment_id,
                refund_id=refund.pk,
            )
        )
    return items


def settlement_attention(*, settlement: PaymentSettlement) -> str:
    """Why a settlement waits for staff: its budget, or a captured amount that differs."""
    txn = settlement.transaction
    if settlement.provider_amount is None:
        return SettlementAttention.BUDGET_SPENT
    if settlement.provider_currency != txn.currency:
        return SettlementAttention.OTHER_CURRENCY
    if settlement.provider_amount > txn.amount:
        return SettlementAttention.CAPTURED_MORE
    return SettlementAttention.CAPTURED_LESS


def refunds_by_status() -> dict[str, int]:
    """Refunds currently in each status (every status present, 0 when none)."""
    counts = dict.fromkeys(RefundStatus.values, 0)
    for row in Refund.objects.values("status").annotate(n=Count("pk")).order_by():
        counts[row["status"]] = row["n"]
    return counts


def settlement_waiting_for_staff(*, settlement_id) -> bool | None:
    """Whether a settlement waits for staff (flagged and not done); None: no such row."""
    row = PaymentSettlement.objects.filter(pk=settlement_id).values("needs_attention", "done_at")
    found = row.first()
    if found is None:
        return None
    return bool(found["needs_attention"] and found["done_at"] is None)


def refunds_succeeded_by_order(*, start: datetime, end: datetime) -> QuerySet:
    """{payment__order__id, total}: money that went back in [start, end), per order.

    A refund counts on the day it succeeded: its terminal update (the money
    moved, or staff recorded it as refunded outside the shop) sets
    `updated_at`, and a succeeded refund is never updated again. The order is
    reached through the reverse name of the order's payment (no import of orders).
    """
    return (
        Refund.objects.filter(
            status=RefundStatus.SUCCEEDED,
            updated_at__gte=start,
            updated_at__lt=end,
            payment__order__isnull=False,
        )
        .values("payment__order__id")
        .annotate(total=Sum("amount"))
        .order_by("payment__order__id")
    )
