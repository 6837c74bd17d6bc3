"""GET /api/v1/reports/daily-sales/: the published reports, newest day first.

Staff holding `reports.view_dailysalesreport` (reports.permissions) only.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.generics import GenericAPIView
from rest_framework.permissions import IsAuthenticated

from core.money import MoneyField
from core.permissions import staff_with

from .models import DailySalesReport
from .permissions import VIEW_REPORTS


class DailySalesReportOut(serializers.Serializer):
    date = serializers.DateField()
    orders = serializers.IntegerField()
    units = serializers.IntegerField()
    revenue = MoneyField()
    refunds = MoneyField()
    returns = serializers.IntegerField()
    currency = serializers.CharField()
    content_hash = serializers.CharField()
    published_at = serializers.DateTimeField()


class DailySalesReportListView(GenericAPIView):
    """List published daily sales reports, newest day first (cursor pagination)."""

    serializer_class = DailySalesReportOut
    permission_classes = [IsAuthenticated, staff_with(VIEW_REPORTS)]

    def paginate_queryset(self, queryset):
        # One row per day: a unique, stable cursor. (The paginator is the settings'
        # CursorPage; the stubs only know BasePagination | None.)
        self.paginator.ordering = "-date"  # type: ignore[union-attr]
        return super().paginate_queryset(queryset)

    @extend_schema(responses=DailySalesReportOut(many=True))
    def get(self, request):
        page = self.paginate_queryset(DailySalesReport.objects.all())
        return self.get_paginated_response(DailySalesReportOut(page, many=True).data)
