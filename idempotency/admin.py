"""Admin views of request keys, the outbox, deliveries, dead letters, the inbox and duplicates.

Outbox rows can be retried; deliveries and dead letters requeued. "Requeue" asks
first, and its confirmation form carries a request key (idempotency.admin_actions.keyed_action):
a double click or two tabs requeue once, on top of the conditional reopen."""

import datetime

from django.contrib import admin
from django.utils import timezone
from django.utils.translation import gettext, gettext_lazy

from core.admin import DueWorkAdmin, ReadOnlyAdmin

from . import metrics
from .admin_actions import keyed_action, redirect_to_value
from .keys import keyed_operation
from .models import (
    DeadLetter,
    Delivery,
    DuplicateCount,
    IdempotencyKey,
    InboxMessage,
    OutboxMessage,
)

# The "Requeue" confirmation's operation name: one phase, answered with a redirect.
ADMIN_DELIVERY_REQUEUE = "admin.delivery.requeue"
keyed_operation(ADMIN_DELIVERY_REQUEUE)(redirect_to_value)


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(ReadOnlyAdmin):
    list_display = (
        "key",
        "owner",
        "operation",
        "recovery_point",
        "response_status",
        "leased_at",
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
    list_display: tuple[str, ...] = (
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

    @admin.display(description=gettext_lazy("event type"))
    def event_type(self, obj) -> str:
        return obj.message.event_type

    def retry_one(self, request, pk) -> bool:
        from .messaging.deliveries import dead_letter_requeue

        return dead_letter_requeue(pk)

    @admin.action(
        description=gettext_lazy("Requeue (fresh attempt budget, published now)"),
        permissions=["change_state"],
    )
    def retry_now(self, request, queryset):
        return keyed_action(
            self,
            request,
            queryset,
            operation=ADMIN_DELIVERY_REQUEUE,
            title=gettext_lazy("Requeue"),
            explanation=gettext_lazy(
                "Give these deliveries a fresh attempt budget and publish them now "
                "(fix the cause first). Deliveries already done stay done."
            ),
            button=gettext_lazy("Requeue"),
            decide=lambda pk: self.retry_one(request, pk),
            done_message=lambda changed, skipped: gettext(
                "{changed} requeued; {skipped} unchanged (already done)."
            ).format(changed=changed, skipped=skipped),
        )


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


# --- Duplicates: counts per mechanism per day, with a chart each ----------------

CHART_DAYS = 30
_BAR, _GAP, _HEIGHT = 14, 2, 120


def duplicate_charts(*, days: int = CHART_DAYS, today: datetime.date | None = None) -> list[dict]:
    """One chart per mechanism: the last `days` days' bars (suspicious stacked on top).

    Geometry is computed here so the template only draws SVG: nothing is
    loaded from another host and no script runs.
    """
    today = today or timezone.now().date()
    first = today - datetime.timedelta(days=days - 1)
    counts: dict[tuple[str, datetime.date], list[int]] = {}
    rows = DuplicateCount.objects.filter(day__gte=first, day__lte=today)
    for row in rows.values("mechanism", "day", "suspicious", "count"):
        pair = counts.setdefault((row["mechanism"], row["day"]), [0, 0])
        pair[1 if row["suspicious"] else 0] += row["count"]
    mechanisms = list(metrics.MECHANISMS) + sorted({m for m, _ in counts} - set(metrics.MECHANISMS))
    charts = []
    for mechanism in mechanisms:
        series = [
            (
                first + datetime.timedelta(days=i),
                *counts.get((mechanism, first + datetime.timedelta(days=i)), (0, 0)),
            )
            for i in range(days)
        ]
        peak = max((ok + bad for _, ok, bad in series), default=0)
        bars = []
        for i, (day, ok, bad) in enumerate(series):
            scale = _HEIGHT / peak if peak else 0
            ok_h, bad_h = round(ok * scale, 1), round(bad * scale, 1)
            bars.append(
                {
                    "x": i * (_BAR + _GAP),
                    "ok_y": round(_HEIGHT - ok_h, 1),
                    "ok_h": ok_h,
                    "bad_y": round(_HEIGHT - ok_h - bad_h, 1),
                    "bad_h": bad_h,
                    "day": day,
                    "ok": ok,
                    "bad": bad,
                }
            )
        charts.append(
            {
                "mechanism": mechanism,
                "total": sum(ok + bad for _, ok, bad in series),
                "suspicious": sum(bad for _, _, bad in series),
                "peak": peak,
                "bars": bars,
                "width": days * (_BAR + _GAP),
                "height": _HEIGHT,
                "first": first,
                "last": today,
            }
        )
    return charts


@admin.register(DuplicateCount)
class DuplicateCountAdmin(ReadOnlyAdmin):
    """The "Duplicates" page: a chart per mechanism per day above the day rows."""

    change_list_template = "admin/idempotency/duplicatecount/change_list.html"
    list_display = ("day", "mechanism", "suspicious", "count")
    list_filter = ("mechanism", "suspicious")
    date_hierarchy = "day"
    ordering = ("-day", "mechanism", "suspicious")

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}), "duplicate_charts": duplicate_charts()}
        extra_context["chart_days"] = CHART_DAYS
        return super().changelist_view(request, extra_context=extra_context)
