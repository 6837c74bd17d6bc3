"""Read-only admin views of request keys, the outbox, deliveries, dead letters and the inbox.

Outbox rows can be retried; deliveries and dead letters requeued."""

from django.contrib import admin

from core.admin import DueWorkAdmin, ReadOnlyAdmin

from .models import DeadLetter, Delivery, IdempotencyKey, InboxMessage, OutboxMessage


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(ReadOnlyAdmin):
    list_display = (
        "key",
        "owner",
        "operation",
        "recovery_point",
        "response_status",
        "locked_at",
        "runs",
        "created_at",
        "finished_at",
    )
    list_filter = ("operation", "recovery_point")
    search_fields = ("key",)
    list_select_related = ("owner",)


@admin.register(OutboxMessage)
class OutboxMessageAdmin(DueWorkAdmin):
    list_display = (
        "event_type",
        "aggregate_type",
        "aggregate_id",
        "created_at",
        *DueWorkAdmin.due_list_display,
    )
    list_filter = ("event_type", "aggregate_type", *DueWorkAdmin.list_filter)
    search_fields = ("aggregate_id",)


class _DeliveryAdmin(DueWorkAdmin):
    list_display = (
        "consumer",
        "message_id",
        "event_type",
        "publishes",
        "created_at",
        *DueWorkAdmin.due_list_display,
    )
    list_filter = ("consumer", *DueWorkAdmin.list_filter)
    search_fields = ("message__id",)
    list_select_related = ("message",)
    actions = ["retry_now"]

    @admin.display(description="event type")
    def event_type(self, obj) -> str:
        return obj.message.event_type

    def retry_one(self, request, pk) -> bool:
        from .deliveries import dead_letter_requeue

        return dead_letter_requeue(pk)

    @admin.action(description="Requeue (fresh attempt budget, published now)")
    def retry_now(self, request, queryset):
        return super().retry_now(request, queryset)


@admin.register(Delivery)
class DeliveryAdmin(_DeliveryAdmin):
    pass


@admin.register(DeadLetter)
class DeadLetterAdmin(_DeliveryAdmin):
    """Deliveries that stopped (poison or budget spent), with the reason; "Requeue" once fixed."""

    list_display = ("consumer", "message_id", "event_type", "attempts", "last_error", "updated_at")
    list_filter = ("consumer",)

    def get_queryset(self, request):
        return super().get_queryset(request).filter(needs_attention=True, done_at__isnull=True)


@admin.register(InboxMessage)
class InboxMessageAdmin(ReadOnlyAdmin):
    list_display = ("consumer", "message_id", "message_type", "status", "received_at")
    list_filter = ("consumer", "status", "message_type")
    search_fields = ("message_id",)
