"""Payments, the calls made to the provider for them, and settlement of lost answers."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils.translation import gettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _

from core.due import DuePolicy, DueWork, due_index

from .states import PaymentStatus, RefundOrigin, RefundStatus


def provider_calls_lease(calls: int) -> float:
    """Seconds an attempt making `calls` provider calls may run at worst: its attempt's lease.

    A call waits at most PAYMENTS_PROVIDER_TIMEOUT to connect and as long
    again for the answer; DUE_ATTEMPT_MARGIN covers the database around them.
    """
    return calls * 2 * settings.PAYMENTS_PROVIDER_TIMEOUT + settings.DUE_ATTEMPT_MARGIN


class PaymentInstallation(models.Model):
    """The one row naming this installation at the provider.

    Its `install_id` prefixes every provider key. Test databases and fresh
    installs restart their numbering (order numbers, ids) while the
    provider's ledger persists; the prefix keeps their keys apart.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1, verbose_name=_("id"))
    install_id = models.CharField(max_length=32, verbose_name=_("install id"))
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))

    class Meta:
        verbose_name = _("payment installation")
        verbose_name_plural = _("payment installations")
        constraints = [
            models.CheckConstraint(condition=Q(id=1), name="payments_installation_singleton"),
        ]

    def __str__(self) -> str:
        return self.install_id


# Allowed status changes; every change writes a PaymentEvent in its transaction.
PAYMENT_TRANSITIONS: dict[str, frozenset[str]] = {
    PaymentStatus.NONE: frozenset({PaymentStatus.PENDING, PaymentStatus.FAILED}),
    PaymentStatus.PENDING: frozenset({PaymentStatus.CAPTURED, PaymentStatus.FAILED}),
    PaymentStatus.CAPTURED: frozenset({PaymentStatus.PARTIALLY_REFUNDED, PaymentStatus.REFUNDED}),
    PaymentStatus.PARTIALLY_REFUNDED: frozenset(
        {PaymentStatus.PARTIALLY_REFUNDED, PaymentStatus.REFUNDED}
    ),
    PaymentStatus.REFUNDED: frozenset(),
    PaymentStatus.FAILED: frozenset(),
}


class Payment(models.Model):
    """Money the shop asks for one operation (`reference`, e.g. "order-42").

    The amounts only grow, by `F()` updates conditional on the status, and
    the database refuses `0 <= refunded <= captured <= authorized <= amount`
    and `refunded <= refund_reserved <= captured` being broken whatever the
    code does.
    """

    id = models.UUIDField(
        primary_key=True, default=uuid.uuid4, editable=False, verbose_name=_("id")
    )
    reference = models.CharField(max_length=100, verbose_name=_("reference"))
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="payments",
        verbose_name=_("owner"),
    )
    amount = models.DecimalField(max_digits=12, decimal_places=2, verbose_name=_("amount"))
    currency = models.CharField(max_length=3, verbose_name=_("currency"))
    payment_method = models.CharField(max_length=64, verbose_name=_("payment method"))
    status = models.CharField(
        max_length=20,
        choices=PaymentStatus.choices,
        default=PaymentStatus.NONE,
        verbose_name=_("status"),
    )
    amount_authorized = models.DecimalField(
        max_digits=12, decimal_places=2, default=0, verbose_name=_("amount authorized")
    )
    amount_captured = models.DecimalField(
        max_digits=12, decimal_places=2, default=0, verbose_name=_("amount captured")
    )
    amount_refunded = models.DecimalField(
        max_digits=12, decimal_places=2, default=0, verbose_name=_("amount refunded")
    )
    # What refunds asked for and still hold (pending, needing attention, or
    # succeeded): reserved in the transaction that creates the refund row,
    # before any provider call, by one conditional UPDATE
    # (`refund_reserved + amount <= amount_captured`); released only by a
    # refund staff record as failed.
    refund_reserved = models.DecimalField(
        max_digits=12, decimal_places=2, default=0, db_default=0, verbose_name=_("refund reserved")
    )
    # Staff recorded a capture whose amount at the provider differs from the one
    # asked (`payments.capture_differs`): only then may what was captured exceed
    # `amount` (docs/payments.md, "A captured amount that differs").
    capture_differs = models.BooleanField(
        default=False, db_default=False, verbose_name=_("capture differs")
    )
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))
    updated_at = models.DateTimeField(db_default=Now(), verbose_name=_("updated at"))

    class Meta:
        verbose_name = _("payment")
        verbose_name_plural = _("payments")
        constraints = [
            models.UniqueConstraint(fields=["reference"], name="payments_payment_reference_uniq"),
            models.CheckConstraint(
                condition=Q(amount_refunded__lte=F("refund_reserved"))
                & Q(refund_reserved__lte=F("amount_captured")),
                name="payments_payment_refunded_le_reserved_le_captured",
            ),
            models.CheckConstraint(
                condition=Q(amount__gt=0), name="payments_payment_amount_positive"
            ),
            models.CheckConstraint(
                condition=Q(amount_refunded__gte=0), name="payments_payment_refunded_non_negative"
            ),
            models.CheckConstraint(
                condition=Q(amount_refunded__lte=F("amount_captured")),
                name="payments_payment_refunded_le_captured",
            ),
            models.CheckConstraint(
                condition=Q(amount_captured__lte=F("amount_authorized")),
                name="payments_payment_captured_le_authorized",
            ),
            models.CheckConstraint(
                condition=Q(amount_authorized__lte=F("amount")) | Q(capture_differs=True),
                name="payments_payment_authorized_le_amount",
            ),
            models.CheckConstraint(
                condition=Q(status__in=PaymentStatus.values), name="payments_payment_status_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.reference} {self.amount} {self.currency} {self.status}"


class TransactionKind(models.TextChoices):
    AUTHORIZE = "authorize", pgettext_lazy("transaction kind", "Authorize")
    CAPTURE = "capture", pgettext_lazy("transaction kind", "Capture")
    VOID = "void", pgettext_lazy("transaction kind", "Void")
    REFUND = "refund", pgettext_lazy("transaction kind", "Refund")


class TransactionStatus(models.TextChoices):
    # sent (or about to be); the outcome is not known yet
    UNKNOWN = "unknown", pgettext_lazy("transaction status", "Unknown")
    SUCCEEDED = "succeeded", pgettext_lazy("transaction status", "Succeeded")
    DECLINED = "declined", pgettext_lazy("transaction status", "Declined")


class PaymentTransaction(models.Model):
    """One call to the provider under one provider key, and what came of it.

    Inserted before the call; unique on (payment, kind, provider key), so
    every retry of the same operation finds the same row and sends the same key.
    """

    payment = models.ForeignKey(
        Payment, on_delete=models.PROTECT, related_name="transactions", verbose_name=_("payment")
    )
    kind = models.CharField(max_length=16, choices=TransactionKind.choices, verbose_name=_("kind"))
    provider_key = models.CharField(max_length=255, verbose_name=_("provider key"))
    amount = models.DecimalField(max_digits=12, decimal_places=2, verbose_name=_("amount"))
    currency = models.CharField(max_length=3, verbose_name=_("currency"))
    status = models.CharField(
        max_length=16,
        choices=TransactionStatus.choices,
        default=TransactionStatus.UNKNOWN,
        verbose_name=_("status"),
    )
    provider_operation_id = models.CharField(
        max_length=64, blank=True, default="", verbose_name=_("provider operation id")
    )
    last_error = models.CharField(
        max_length=500, blank=True, default="", verbose_name=_("last error")
    )
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))
    updated_at = models.DateTimeField(db_default=Now(), verbose_name=_("updated at"))

    class Meta:
        verbose_name = _("payment transaction")
        verbose_name_plural = _("payment transactions")
        constraints = [
            models.UniqueConstraint(
                fields=["payment", "kind", "provider_key"],
                name="payments_transaction_payment_kind_key_uniq",
            ),
            models.CheckConstraint(
                condition=Q(amount__gte=0), name="payments_transaction_amount_non_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.provider_key} {self.status}"


class PaymentSettlement(DueWork):
    """A provider call whose outcome the shop must still learn (due work, `core.due`).

    Written in the same transaction that prepares the call, before the call
    is made, so a process that dies mid-call leaves this row behind. The
    beat sweeper finds it when `next_attempt_at` has passed; each attempt
    looks the call up at the provider by its key. After the attempt budget
    it stops and waits for staff (`needs_attention`). `done_at` is when the
    outcome was recorded (`settled_at`).
    """

    transaction = models.ForeignKey(
        PaymentTransaction,
        on_delete=models.PROTECT,
        related_name="settlements",
        verbose_name=_("transaction"),
    )
    # What the provider reports it captured when that differs from the amount
    # asked (the settlement then waits for staff: `payments.capture_differs`).
    provider_amount = models.DecimalField(
        max_digits=12, decimal_places=2, null=True, blank=True, verbose_name=_("provider amount")
    )
    provider_currency = models.CharField(
        max_length=3, blank=True, default="", db_default="", verbose_name=_("provider currency")
    )
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))
    updated_at = models.DateTimeField(db_default=Now(), verbose_name=_("updated at"))

    class Meta:
        verbose_name = _("payment settlement")
        verbose_name_plural = _("payment settlements")
        constraints = [
            models.UniqueConstraint(
                fields=["transaction"], name="payments_settlement_transaction_uniq"
            ),
        ]
        indexes = [due_index(name="payments_settlement_due_idx")]

    def __str__(self) -> str:
        return gettext("settlement of {transaction} (attempt {attempt})").format(
            transaction=self.transaction_id, attempt=self.attempts
        )

    @property
    def settled_at(self):
        """When the outcome was recorded (the due-work row's `done_at`)."""
        return self.done_at

    @classmethod
    def due_policy(cls) -> DuePolicy:
        return DuePolicy.from_settings(
            "PAYMENTS_SETTLE",
            task="payments.settle_payment",
            attempt_lease=provider_calls_lease(2),  # look-up, then re-send
        )


class PaymentEvent(models.Model):
    """What happened to a payment: every status change and every staff flag."""

    payment = models.ForeignKey(
        Payment, on_delete=models.PROTECT, related_name="events", verbose_name=_("payment")
    )
    kind = models.CharField(
        max_length=32, verbose_name=_("kind")
    )  # "transition" | "needs_attention" | "retry"
    from_status = models.CharField(
        max_length=20, blank=True, default="", verbose_name=_("from status")
    )
    to_status = models.CharField(max_length=20, blank=True, default="", verbose_name=_("to status"))
    detail = models.JSONField(default=dict, verbose_name=_("detail"))
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))

    class Meta:
        verbose_name = _("payment event")
        verbose_name_plural = _("payment events")
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.payment_id} {self.kind} {self.from_status}->{self.to_status}"


class Refund(DueWork):
    """One refund of a payment, by its refund id, whatever asked for it (due work, `core.due`).

    The id is the caller's refund id (minted once by the keyed API request,
    derived from a return or a cancellation): inserting it twice is one
    refund. Its amount is reserved on the payment in the transaction that
    inserts it; the provider key is `<install id>:refund-<id>:refund`, so
    every attempt, redelivery and sweep sends the same key. `status` moves
    only by conditional UPDATEs (payments.recording, payments.refund_decisions):
    pending → succeeded | needs_attention; needs_attention → succeeded | failed
    (staff, or the provider's late answer).
    """

    id = models.UUIDField(primary_key=True, editable=False, verbose_name=_("id"))
    payment = models.ForeignKey(
        Payment, on_delete=models.PROTECT, related_name="refunds", verbose_name=_("payment")
    )
    transaction = models.OneToOneField(
        PaymentTransaction,
        on_delete=models.PROTECT,
        related_name="refund",
        verbose_name=_("transaction"),
    )
    amount = models.DecimalField(max_digits=12, decimal_places=2, verbose_name=_("amount"))
    currency = models.CharField(max_length=3, verbose_name=_("currency"))
    reason = models.CharField(max_length=500, verbose_name=_("reason"))
    origin = models.CharField(max_length=16, choices=RefundOrigin.choices, verbose_name=_("origin"))
    status = models.CharField(
        max_length=20,
        choices=RefundStatus.choices,
        default=RefundStatus.PENDING,
        verbose_name=_("status"),
    )
    provider_key = models.CharField(max_length=255, verbose_name=_("provider key"))
    # Staff recorded the money as given back outside the provider (no provider refund).
    outside_shop = models.BooleanField(
        default=False, db_default=False, verbose_name=_("outside shop")
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("requested by"),
    )
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("resolved by"),
    )
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))
    updated_at = models.DateTimeField(db_default=Now(), verbose_name=_("updated at"))

    class Meta:
        verbose_name = _("refund")
        verbose_name_plural = _("refunds")
        constraints = [
            models.UniqueConstraint(fields=["provider_key"], name="payments_refund_key_uniq"),
            models.CheckConstraint(condition=Q(amount__gt=0), name="payments_refund_positive"),
            models.CheckConstraint(
                condition=Q(status__in=RefundStatus.values), name="payments_refund_status_valid"
            ),
        ]
        indexes = [
            due_index(name="payments_refund_due_idx"),
            models.Index(fields=["payment", "created_at"], name="payments_refund_payment_idx"),
        ]

    def __str__(self) -> str:
        return gettext("refund {id} {amount} {currency} {status}").format(
            id=self.id, amount=self.amount, currency=self.currency, status=self.status
        )

    @classmethod
    def due_policy(cls) -> DuePolicy:
        return DuePolicy.from_settings(
            "PAYMENTS_REFUND",
            task="payments.refund",
            attempt_lease=provider_calls_lease(3),  # look-up, refund, look-up
        )
