"""Staff decisions on a refund that needs attention, and the provider's late word after one.

Staff retry a refund (`refund_retry_now`), record it refunded outside the
shop (`refund_record_outside`) or failed (`refund_record_failed`), each once
by a conditional transition of the refund row (`payments.recording`). When
the provider reports afterwards that it refunded it after all
(`refund_late_success`, from its webhook), the
refund becomes a needs-attention item until staff take "Accept the
provider's refund" (`refund_accept_provider`).
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now

from core import due

from .lock_objects import payment_lock
from .models import (
    Payment,
    PaymentEvent,
    Refund,
    RefundStatus,
    TransactionStatus,
)
from .recording import refund_call_close, refund_event, refund_succeed
from .refunds import refund_reserve

logger = logging.getLogger(__name__)


def refund_record_outside(*, refund_id, by=None) -> bool:
    """Staff: the money went back outside the shop; record the refund as succeeded, once.

    Only a refund in `needs_attention`; the same conditional transition as
    the provider's answer (`amount_refunded` moves), without calling the
    provider. A second click finds it succeeded and changes nothing (False).
    """
    return refund_succeed(
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
        refund_event(
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
        refund_event(
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
            held = refund_reserve(payment_id=refund.payment_id, amount=refund.amount)
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
        refund_call_close(
            transaction_id=refund.transaction_id,
            status=TransactionStatus.SUCCEEDED,
            operation_id=operation_id,
            error=reason,
        )
        refund_event(
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
            refund_event(
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
        ).exists() or refund_reserve(payment_id=payment.id, amount=refund.amount)
        if held:
            refund_succeed(refund_id=refund.id, via="staff", from_statuses=("failed",))
            Refund.objects.filter(id=refund.id).update(resolved_by=by, last_error="")
            outcome = "booked as refunded"
        else:
            Refund.objects.filter(id=refund.id).update(
                needs_attention=False, resolved_by=by, updated_at=Now()
            )
            outcome = "double refund acknowledged; the refund stays failed"
        refund_event(
            payment_id=refund.payment_id,
            kind="late_provider_refund_accepted",
            detail={**detail, "outcome": outcome},
        )
    return True
