"""Read-only admin views of request keys, the outbox and the inbox; outbox rows can be retried."""

from django.contrib import admin

from core.admin import DueWorkAdmin, ReadOnlyAdmin

from .models import IdempotencyKey, InboxMessage, OutboxMessage


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


@admin.register(InboxMessage)
class InboxMessageAdmin(ReadOnlyAdmin):
    list_display = ("consumer", "message_id", "message_type", "status", "received_at")
    list_filter = ("consumer", "status", "message_type")
    search_fields = ("message_id",)
