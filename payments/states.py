"""The payments app's statuses and origins: what other apps compare with and pass in.

Kept apart from the models so another app can name a status without
importing this app's models (tests/test_layout.py); the models use them as
their fields' choices.
"""

from django.db import models
from django.utils.translation import pgettext_lazy


class PaymentStatus(models.TextChoices):
    NONE = "none", pgettext_lazy("payment status", "None")
    PENDING = "pending", pgettext_lazy("payment status", "Pending")
    CAPTURED = "captured", pgettext_lazy("payment status", "Captured")
    PARTIALLY_REFUNDED = "partially_refunded", pgettext_lazy("payment status", "Partially Refunded")
    REFUNDED = "refunded", pgettext_lazy("payment status", "Refunded")
    FAILED = "failed", pgettext_lazy("payment status", "Failed")


class RefundOrigin(models.TextChoices):
    # a staff refund (API or admin)
    GOODWILL = "goodwill", pgettext_lazy("refund origin", "Goodwill")
    RETURN = "return", pgettext_lazy("refund origin", "Return")  # a return's refund step
    # a cancelled order's refund
    CANCELLATION = "cancellation", pgettext_lazy("refund origin", "Cancellation")
    # the provider captured more than asked: the difference
    OVERCAPTURE = "overcapture", pgettext_lazy("refund origin", "Overcapture")


class RefundStatus(models.TextChoices):
    # reserved; the provider call is due (or its answer unknown)
    PENDING = "pending", pgettext_lazy("refund status", "Pending")
    # the money went back (amount_refunded moved)
    SUCCEEDED = "succeeded", pgettext_lazy("refund status", "Succeeded")
    # staff recorded that it will not happen; the reservation is released
    FAILED = "failed", pgettext_lazy("refund status", "Failed")
    # refused by the provider, or budget spent: staff decide
    NEEDS_ATTENTION = "needs_attention", pgettext_lazy("refund status", "Needs Attention")


class SettlementAttention(models.TextChoices):
    """Why a settlement waits for staff (the "Needs attention" item's status)."""

    # no final answer within the attempt budget
    BUDGET_SPENT = "budget_spent", pgettext_lazy("settlement attention", "Budget Spent")
    # the provider captured more than asked
    CAPTURED_MORE = "captured_more", pgettext_lazy("settlement attention", "Captured More")
    # the provider captured less than asked
    CAPTURED_LESS = "captured_less", pgettext_lazy("settlement attention", "Captured Less")
    # the provider captured in another currency
    OTHER_CURRENCY = "other_currency", pgettext_lazy("settlement attention", "Other Currency")
