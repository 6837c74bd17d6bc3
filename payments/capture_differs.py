"""A capture whose amount at the provider differs from the one asked: staff's exits.

The recorders (`payments.recording.capture_record`) never book an amount the
shop did not ask for: the settlement waits for staff with the provider's
amount kept on its row (`provider_amount`, `provider_currency`), and the
order stays `payment_pending`. Staff end it with one of two decisions
(docs/payments.md, "A captured amount that differs"):

- "Record what the provider captured" (`settlement_record_provider_capture`):
  the payment records the provider's amount and the order is paid (confirmed,
  its reservations committed). Less than asked: the shop accepts the
  shortfall (cancelling the order afterwards refunds everything captured).
  More than asked: the shop keeps it, refundable through the order's "Refund".
- "Refund the difference" (`settlement_refund_difference`, only when the
  provider captured more): the same record, and in the same transaction a
  refund of captured − asked through the ordinary refund machinery, its id
  (and so its provider key) derived from the payment's.

Each is one transaction with the payment locked first (as every recorder
locks it) and changes something only while the payment is `pending` and its
settlement waits for staff with a differing amount: the first decision wins,
a double click, a second tab, the other decision, a late webhook or a
settlement attempt after it change nothing. The provider is never called
here; the refund's call is the `payments.refund` task's, rung after commit.
"""

from __future__ import annotations

import uuid

from django.db import transaction

from .lock_objects import payment_lock
from .models import PaymentSettlement, PaymentStatus
from .recording import capture_record_differing
from .refunds import refund_request
from .states import RefundOrigin

# The refund of an over-capture's difference: one per payment, whoever asks.
_DIFFERENCE_NAMESPACE = uuid.UUID("6f1d3c52-4b0e-4f7a-9a51-2d8c0b7e9e11")


def difference_refund_id(*, payment_id) -> uuid.UUID:
    """The refund id of the difference of one payment's over-capture (derived, never random)."""
    return uuid.uuid5(_DIFFERENCE_NAMESPACE, f"{payment_id}:capture-difference")


def capture_difference(*, settlement: PaymentSettlement):
    """captured − asked of a settlement waiting with a differing amount; None if it has none.

    None too when the provider answered in another currency: no amount of
    this payment's currency says what it captured.
    """
    txn = settlement.transaction
    if settlement.provider_amount is None or settlement.provider_currency != txn.currency:
        return None
    return settlement.provider_amount - txn.amount


def _record(*, settlement_id: int, by, refund_difference: bool) -> bool:
    row = (
        PaymentSettlement.objects.select_related("transaction")
        .filter(id=settlement_id)
        .values_list("transaction__payment_id", flat=True)
        .first()
    )
    if row is None:
        return False  # no such settlement (a forged form)
    payment = payment_lock(payment_id=row)
    # Read under the payment's lock: every recorder takes it before it moves the payment.
    settlement = PaymentSettlement.objects.select_related("transaction").get(id=settlement_id)
    difference = capture_difference(settlement=settlement)
    waiting = settlement.needs_attention and settlement.done_at is None
    if payment.status != PaymentStatus.PENDING or not waiting or not difference:
        return False  # decided already, or not a differing capture
    if refund_difference and difference < 0:
        return False  # nothing to give back: the provider captured less
    txn = settlement.transaction
    assert settlement.provider_amount is not None  # a difference was found
    moved = capture_record_differing(
        payment=payment,
        txn=txn,
        amount=settlement.provider_amount,
        operation_id=txn.provider_operation_id,
        by=by,
    )
    if moved is None:  # cannot happen: the payment is locked and pending
        return False
    if refund_difference:
        refund_request(
            refund_id=difference_refund_id(payment_id=payment.id),
            payment_id=payment.id,
            amount=difference,
            reason=f"the provider captured {settlement.provider_amount} {txn.currency}, "
            f"the shop asked {txn.amount} {txn.currency}: the difference",
            origin=RefundOrigin.OVERCAPTURE,
            requested_by=by,
        )
    return True


@transaction.atomic
def settlement_record_provider_capture(*, settlement_id: int, by=None) -> bool:
    """Staff: record what the provider captured; the order is paid. True if this call did it."""
    return _record(settlement_id=settlement_id, by=by, refund_difference=False)


@transaction.atomic
def settlement_refund_difference(*, settlement_id: int, by=None) -> bool:
    """Staff: record what the provider captured and refund what it took over the amount asked.

    Only when the provider captured more; True if this call did it.
    """
    return _record(settlement_id=settlement_id, by=by, refund_difference=True)
