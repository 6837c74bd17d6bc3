"""Staff views of payments; settlements that need attention can be retried from here."""

from django.contrib import admin

from core.admin import DueWorkAdmin, ReadOnlyAdmin, ReadOnlyInline

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
class PaymentSettlementAdmin(DueWorkAdmin):
    list_display = ["id", "transaction", *DueWorkAdmin.due_list_display]

    def retry_one(self, request, pk) -> bool:
        # The payment's history records who retried it (a PaymentEvent).
        before = PaymentSettlement.objects.filter(pk=pk, done_at__isnull=True).exists()
        services.settlement_retry_now(settlement_id=pk, by=request.user)
        return before
