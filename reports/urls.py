from django.urls import path

from . import api

urlpatterns = [
    path(
        "reports/daily-sales/",
        api.DailySalesReportListView.as_view(),
        name="reports-daily-sales",
    ),
]
