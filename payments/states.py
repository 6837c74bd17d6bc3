"""The payments app's statuses and origins: what other apps compare with and pass in.

Kept apart from the models so another app can name a status without
importing this app's models (tests/test_layout.py); the models use them as
their fields' choices.
"""

from django.db import models


class PaymentStatus(models.TextChoices):
    NONE = "none"
    PENDING = "pending"
    CAPTURED = "captured"
    PARTIALLY_REFUNDED = "partially_refunded"
    REFUNDED = "refunded"
    FAILED = "failed"


class RefundOrigin(models.TextChoices):
    GOODWILL = "goodwill"  # a staff refund (API or admin)
    RETURN = "return"  # a return's refund step
    CANCELLATION = "cancellation"  # a cancelled order's refund
    OVERCAPTURE = "overcapture"  # the provider captured more than asked: the difference


class RefundStatus(models.TextChoices):
    PENDING = "pending"  # reserved; the provider call is due (or its answer unknown)
    SUCCEEDED = "succeeded"  # the money went back (amount_refunded moved)
    FAILED = "failed"  # staff recorded that it will not happen; the reservation is released
    NEEDS_ATTENTION = "needs_attention"  # refused by the provider, or budget spent: staff decide


class SettlementAttention(models.TextChoices):
    """Why a settlement waits for staff (the "Needs attention" item's status)."""

    BUDGET_SPENT = "budget_spent"  # no final answer within the attempt budget
    CAPTURED_MORE = "captured_more"  # the provider captured more than asked
    CAPTURED_LESS = "captured_less"  # the provider captured less than asked
    OTHER_CURRENCY = "other_currency"  # the provider captured in another currency
