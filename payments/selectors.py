"""Reads of the payments app."""

from __future__ import annotations

from django.db.models import QuerySet

from core.errors import NotFound

from .models import (
    Payment,
    PaymentInstallation,
    PaymentSettlement,
    PaymentTransaction,
    Refund,
)


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
