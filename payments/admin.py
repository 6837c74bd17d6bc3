"""Staff views of payments; settlements that need attention can be retried from here."""

from django.contrib import admin, messages

from core.admin import ReadOnlyAdmin, ReadOnlyInline

from . import services
from .models import Payment, PaymentEvent, PaymentSettlement, PaymentTransaction


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
class PaymentSettlementAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "transaction",
        "attempts",
        "next_attempt_at",
        "needs_attention",
        "settled_at",
        "last_error",
    ]
    list_filter = ["needs_attention", ("settled_at", admin.EmptyFieldListFilter)]
    actions = ["retry_now"]

    @admin.action(description="Retry settlement now (fresh attempt budget)")
    def retry_now(self, request, queryset):
        for settlement_id in queryset.values_list("id", flat=True):
            services.settlement_retry_now(settlement_id=settlement_id, by=request.user)
        messages.success(request, "Settlements scheduled.")
