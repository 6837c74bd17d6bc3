"""Staff views of payments; settlements and refunds that need attention are decided here."""

from django.contrib import admin
from django.urls import reverse
from django.utils.functional import Promise
from django.utils.html import format_html
from django.utils.translation import gettext, gettext_lazy

from core.admin import DueWorkAdmin, ReadOnlyAdmin, ReadOnlyInline
from core.admin_export import CsvExportMixin
from idempotency.admin_actions import keyed_action, redirect_to_value
from idempotency.keys import keyed_operation

from . import refund_decisions, settlement
from .models import Payment, PaymentEvent, PaymentSettlement, PaymentTransaction, Refund

# The confirmations' operation names: one phase, answered with a redirect.
ADMIN_REFUND_OUTSIDE = "admin.refund.outside"
ADMIN_REFUND_FAILED = "admin.refund.failed"
ADMIN_REFUND_ACCEPT_PROVIDER = "admin.refund.accept_provider"
keyed_operation(ADMIN_REFUND_OUTSIDE, ADMIN_REFUND_FAILED, ADMIN_REFUND_ACCEPT_PROVIDER)(
    redirect_to_value
)


class TransactionInline(ReadOnlyInline):
    model = PaymentTransaction
    fields = ["kind", "provider_key", "amount", "currency", "status", "last_error", "created_at"]
    readonly_fields = fields


class EventInline(ReadOnlyInline):
    model = PaymentEvent
    fields = ["kind", "from_status", "to_status", "detail", "created_at"]
    readonly_fields = fields


@admin.register(Payment)
class PaymentAdmin(ReadOnlyAdmin):
    list_display = [
        "reference",
        "status",
        "amount",
        "amount_captured",
        "amount_refunded",
        "created_at",
    ]
    list_filter = ["status", "payment_method"]
    # `=order__number`: the number staff read off a receipt; the shopper's e-mail.
    search_fields = ["reference", "=order__number", "order__owner__email"]
    inlines = [TransactionInline, EventInline]
    readonly_fields = ["order_link"]

    # The order it pays for (a reverse one-to-one; none for a payment of no order).
    @admin.display(description=gettext_lazy("order"))
    def order_link(self, payment):
        order = getattr(payment, "order", None)
        if order is None:
            return "-"
        url = reverse("admin:orders_order_change", args=[order.pk])
        return format_html('<a href="{}">{}</a>', url, order.number)


@admin.register(PaymentSettlement)
class PaymentSettlementAdmin(DueWorkAdmin):
    list_display = ["id", "transaction", *DueWorkAdmin.due_list_display]
    list_select_related = ["transaction"]
    search_fields = [
        "=transaction__payment__order__number",
        "transaction__payment__order__owner__email",
    ]

    def retry_one(self, request, pk) -> bool:
        # The payment's history records who retried it (a PaymentEvent).
        before = PaymentSettlement.objects.filter(pk=pk, done_at__isnull=True).exists()
        settlement.settlement_retry_now(settlement_id=pk, by=request.user)
        return before


REFUND_CSV_COLUMNS = [
    ("id", "id"),
    ("created_at", "created_at"),
    ("order", "payment__order__number"),
    ("email", "payment__order__owner__email"),
    ("amount", "amount"),
    ("currency", "currency"),
    ("status", "status"),
    ("origin", "origin"),
    ("outside_shop", "outside_shop"),
    ("reason", "reason"),
    ("attempts", "attempts"),
    ("last_error", "last_error"),
]


@admin.register(Refund)
class RefundAdmin(CsvExportMixin, DueWorkAdmin):
    """Refunds, read-only; staff decide the ones that need attention.

    "Refunded outside the shop" and "Record as failed" ask for confirmation,
    whose form carries a request key (idempotency.admin_actions.keyed_action: a double click
    or a second tab of it is a replay), and are conditional transitions
    (`needs_attention` → succeeded / failed): a second confirmation or a race
    with the provider's late answer changes nothing. "Retry now" sends the same provider key again.
    """

    list_display = [
        "id",
        "payment",
        "amount",
        "currency",
        "status",
        "origin",
        "outside_shop",
        "reason",
        "created_at",
        *DueWorkAdmin.due_list_display,
    ]
    list_filter = ["status", "origin", *DueWorkAdmin.list_filter]
    list_select_related = ["payment"]
    search_fields = [
        "=id",
        "payment__reference",
        "=provider_key",
        "=payment__order__number",
        "payment__order__owner__email",
    ]
    ordering = ["-created_at"]
    # "Export CSV" (core.admin_export): the list as filtered, streamed.
    csv_columns = REFUND_CSV_COLUMNS
    csv_filename = "refunds.csv"
    actions = ["retry_now", "refunded_outside_shop", "record_failed", "accept_provider_refund"]

    def retry_one(self, request, pk) -> bool:
        return refund_decisions.refund_retry_now(refund_id=pk, by=request.user)

    def _decide(
        self, request, queryset, *, operation: str, title: str | Promise, explanation, decide
    ):
        return keyed_action(
            self,
            request,
            queryset,
            operation=operation,
            title=title,
            explanation=explanation,
            button=gettext("Yes, {action}").format(action=str(title).lower()),
            decide=lambda pk: decide(refund_id=pk, by=request.user),
            done_message=lambda changed, skipped: gettext(
                "{changed} recorded; {skipped} unchanged (not needing attention)."
            ).format(changed=changed, skipped=skipped),
        )

    @admin.action(
        description=gettext_lazy("Refunded outside the shop"), permissions=["change_state"]
    )
    def refunded_outside_shop(self, request, queryset):
        return self._decide(
            request,
            queryset,
            operation=ADMIN_REFUND_OUTSIDE,
            title=gettext_lazy("Refunded outside the shop"),
            explanation=gettext_lazy(
                "Record these refunds as given back outside the provider (bank transfer, "
                "the provider's dashboard). The payment's refunded amount moves; the provider "
                "is not called. Only refunds that need attention change."
            ),
            decide=refund_decisions.refund_record_outside,
        )

    @admin.action(
        description=gettext_lazy("Record as failed (release the reserved amount)"),
        permissions=["change_state"],
    )
    def record_failed(self, request, queryset):
        return self._decide(
            request,
            queryset,
            operation=ADMIN_REFUND_FAILED,
            title=gettext_lazy("Record as failed"),
            explanation=gettext_lazy(
                "Record that these refunds will not happen. Their reserved amounts become "
                "refundable again. Only refunds that need attention change."
            ),
            decide=refund_decisions.refund_record_failed,
        )

    @admin.action(
        description=gettext_lazy("Accept the provider's refund"), permissions=["change_state"]
    )
    def accept_provider_refund(self, request, queryset):
        return self._decide(
            request,
            queryset,
            operation=ADMIN_REFUND_ACCEPT_PROVIDER,
            title=gettext_lazy("Accept the provider's refund"),
            explanation=gettext_lazy(
                "The provider refunded these after they were recorded as outside the "
                "shop or failed. Recorded outside the shop: the provider's refund becomes the "
                "record (the payment made outside was recovered or accepted). Recorded failed: "
                "the refund counts as refunded. Only refunds flagged for this change."
            ),
            decide=refund_decisions.refund_accept_provider,
        )
