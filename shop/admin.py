"""Admin view of the shopper e-mails: what was sent, what waits, what needs attention.

Read-only (`core.admin.DueWorkAdmin`): rows change only through `shop.emails`;
the one action, "Retry now", gives a mail that needs attention a fresh budget.
"""

from django.contrib import admin

from core.admin import DueWorkAdmin

from .models import Mail


@admin.register(Mail)
class MailAdmin(DueWorkAdmin):
    list_display = ("id", "event_type", "address", "created_at", *DueWorkAdmin.due_list_display)
    list_filter = ("event_type", *DueWorkAdmin.list_filter)
    search_fields = ("address", "message_id")
    fields = (
        "message_id",
        "event_type",
        "address",
        "user",
        "payload",
        "created_at",
        "updated_at",
        *DueWorkAdmin.due_list_display,
        "lease_owner",
    )
    readonly_fields = fields
