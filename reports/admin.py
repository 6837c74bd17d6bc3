"""Staff view of the published sales reports: read-only, with a per-day chart."""

from django.contrib import admin
from django.utils.html import format_html
from django.utils.translation import gettext_lazy

from core.admin import ReadOnlyAdmin
from core.admin_export import CsvExportMixin

from . import charts
from .models import DailySalesReport, ReportDay

CHART_DAYS = 60


@admin.register(DailySalesReport)
class DailySalesReportAdmin(CsvExportMixin, ReadOnlyAdmin):
    change_list_template = "admin/reports/dailysalesreport/change_list.html"
    # "Export CSV" (core.admin_export): the days as filtered, streamed.
    csv_columns = [
        (name, name)
        for name in (
            "date",
            "orders",
            "units",
            "revenue",
            "refunds",
            "returns",
            "currency",
            "revision",
            "content_hash",
            "published_at",
        )
    ]
    csv_filename = "daily-sales.csv"
    list_display = [
        "date",
        "orders",
        "units",
        "revenue",
        "refunds",
        "returns",
        "currency",
        "revision",
        "replacement",
        "short_hash",
        "published_at",
    ]
    list_filter = ["revision"]
    ordering = ["-date"]
    date_hierarchy = "date"
    fields = [
        "date",
        "orders",
        "units",
        "revenue",
        "refunds",
        "returns",
        "currency",
        "content_hash",
        "published_at",
        "revision",
        "replacement",
        "previous_content_hash",
    ]
    readonly_fields = fields

    @admin.display(description=gettext_lazy("replaced"))
    def replacement(self, report):
        if report.revision == 1:
            return "-"
        return format_html(
            "Replaced: revision {} since {} (new data for a past day)",
            report.revision,
            report.replaced_at.isoformat(timespec="seconds"),
        )

    @admin.display(description=gettext_lazy("content hash"))
    def short_hash(self, report):
        return report.content_hash[:12]

    def changelist_view(self, request, extra_context=None):
        recent = list(DailySalesReport.objects.order_by("-date")[:CHART_DAYS])
        extra_context = {
            **(extra_context or {}),
            "chart_panels": charts.panels(recent),
            "chart_days": len(recent),
        }
        return super().changelist_view(request, extra_context=extra_context)


@admin.register(ReportDay)
class ReportDayAdmin(ReadOnlyAdmin):
    """The days the sales report must make (docs/reports.md, "Every closed day, once")."""

    list_display = ["date", "made", "attempts", "needs_attention", "next_attempt_at", "last_error"]
    list_filter = ["needs_attention", ("done_at", admin.EmptyFieldListFilter)]
    ordering = ["-date"]
    date_hierarchy = "date"
    fields = [
        "date",
        "done_at",
        "attempts",
        "next_attempt_at",
        "needs_attention",
        "last_error",
        "lease_owner",
        "lease_expires_at",
        "created_at",
        "updated_at",
    ]
    readonly_fields = fields

    @admin.display(description=gettext_lazy("made"), boolean=True)
    def made(self, day) -> bool:
        return day.done_at is not None
