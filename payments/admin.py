"""Staff views of payments; settlements and refunds that need attention are decided here."""

from django.contrib import admin

from core.admin import DueWorkAdmin, ReadOnlyAdmin, ReadOnlyInline
from idempotency.admin_actions import keyed_action

from . import services
from .models import Payment, PaymentEvent, PaymentSettlement, PaymentTransaction, Refund

# The confirmations' operation names (registered in PaymentsConfig.ready).
ADMIN_REFUND_OUTSIDE = "admin.refund.outside"
ADMIN_REFUND_FAILED = "admin.refund.failed"
ADMIN_REFUND_ACCEPT_PROVIDER = "admin.refund.accept_provider"


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
    search_fields = ["reference"]
    inlines = [TransactionInline, EventInline]


@admin.register(PaymentSettlement)
class PaymentSettlementAdmin(DueWorkAdmin):
    list_display = ["id", "transaction", *DueWorkAdmin.due_list_display]

    def retry_one(self, request, pk) -> bool:
        # The payment's history records who retried it (a PaymentEvent).
        before = PaymentSettlement.objects.filter(pk=pk, done_at__isnull=True).exists()
        services.settlement_retry_now(settlement_id=pk, by=request.user)
        return before


@admin.register(Refund)
class RefundAdmin(DueWorkAdmin):
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
    search_fields = ["=id", "payment__reference", "=provider_key"]
    ordering = ["-created_at"]
    actions = ["retry_now", "refunded_outside_shop", "record_failed", "accept_provider_refund"]

    def retry_one(self, request, pk) -> bool:
        return services.refund_retry_now(refund_id=pk, by=request.user)

    def _decide(self, request, queryset, *, operation: str, title: str, explanation, decide):
        return keyed_action(
            self,
            request,
            queryset,
            operation=operation,
            title=title,
            explanation=explanation,
            button=f"Yes, {title.lower()}",
            decide=lambda pk: decide(refund_id=pk, by=request.user),
            done_message=lambda changed, skipped: (
                f"{changed} recorded; {skipped} unchanged (not needing attention)."
            ),
        )

    @admin.action(description="Refunded outside the shop")
    def refunded_outside_shop(self, request, queryset):
        return self._decide(
            request,
            queryset,
            operation=ADMIN_REFUND_OUTSIDE,
            title="Refunded outside the shop",
            explanation="Record these refunds as given back outside the provider (bank transfer, "
            "the provider's dashboard). The payment's refunded amount moves; the provider is not "
            "called. Only refunds that need attention change.",
            decide=services.refund_record_outside,
        )

    @admin.action(description="Record as failed (release the reserved amount)")
    def record_failed(self, request, queryset):
        return self._decide(
            request,
            queryset,
            operation=ADMIN_REFUND_FAILED,
            title="Record as failed",
            explanation="Record that these refunds will not happen. Their reserved amounts become "
            "refundable again. Only refunds that need attention change.",
            decide=services.refund_record_failed,
        )

    def has_decide_permission(self, request) -> bool:
        # The admin is read-only (no "change" form); deciding a refund needs the model's
        # change permission all the same: a view-only staff user gets no such action.
        return request.user.has_perm("payments.change_refund")

    @admin.action(description="Accept the provider's refund", permissions=["decide"])
    def accept_provider_refund(self, request, queryset):
        return self._decide(
            request,
            queryset,
            operation=ADMIN_REFUND_ACCEPT_PROVIDER,
            title="Accept the provider's refund",
            explanation="The provider refunded these after they were recorded as outside the "
            "shop or failed. Recorded outside the shop: the provider's refund becomes the record "
            "(the payment made outside was recovered or accepted). Recorded failed: the refund "
            "counts as refunded. Only refunds flagged for this change.",
            decide=services.refund_accept_provider,
        )
