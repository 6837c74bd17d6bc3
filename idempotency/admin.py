"""Read-only admin views of request keys, the outbox and the inbox (for operators)."""

from django.contrib import admin

from core.admin import ReadOnlyAdmin

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
class OutboxMessageAdmin(ReadOnlyAdmin):
    list_display = (
        "event_type",
        "aggregate_type",
        "aggregate_id",
        "created_at",
        "published_at",
        "attempts",
        "next_attempt_at",
    )
    list_filter = ("event_type", "aggregate_type")
    search_fields = ("aggregate_id",)


@admin.register(InboxMessage)
class InboxMessageAdmin(ReadOnlyAdmin):
    list_display = ("consumer", "message_id", "message_type", "status", "received_at")
    list_filter = ("consumer", "status", "message_type")
    search_fields = ("message_id",)
