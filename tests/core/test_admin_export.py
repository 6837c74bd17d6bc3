"""The admin's CSV exports (orders, refunds, sales reports): streamed row by row.

The rows come from a server-side cursor in chunks (`.iterator(chunk_size)`),
inside a StreamingHttpResponse, so a list of 100k orders is never loaded at
once; the export is the list as filtered and searched; it needs the model's
view permission.
"""

from __future__ import annotations

import csv
import datetime
import io
from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.db.models.query import QuerySet
from django.http import StreamingHttpResponse
from django.test import Client

from core import admin_export
from core.admin_export import csv_cell
from orders.services import order_hold
from reports.models import DailySalesReport
from tests.orders.conftest import ADDRESS, line_requests

pytestmark = pytest.mark.django_db


def browser_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def admin_browser(make_user):
    user = make_user(staff=True)
    user.is_superuser = True
    user.save(update_fields=["is_superuser"])
    return browser_for(user)


@pytest.fixture
def orders(make_product, make_user):
    make_product("TEE-M", price="19.99", stock=100)
    owner = make_user(username="alice")
    return [
        order_hold(
            owner=owner,
            lines=line_requests({"TEE-M": 1}),
            on_shortage="reject",
            payment_method="pm_card_ok",
            shipping_address=ADDRESS,
        )
        for _ in range(5)
    ]


@pytest.fixture
def iterations(monkeypatch):
    """Each `QuerySet.iterator()` call's chunk size, the real iterator underneath."""
    calls: list[int | None] = []
    real = QuerySet.iterator

    def spy(self, chunk_size=None):
        calls.append(chunk_size)
        return real(self, chunk_size=chunk_size)

    monkeypatch.setattr(QuerySet, "iterator", spy)
    return calls


def rows_of(response) -> list[list[str]]:
    return list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))


def test_orders_export_streams_every_row_in_chunks(admin_browser, orders, iterations, monkeypatch):
    monkeypatch.setattr(admin_export, "CHUNK_SIZE", 2)  # 5 orders: three chunks
    response = admin_browser.get("/admin/orders/order/export.csv")
    assert response.status_code == 200
    assert isinstance(response, StreamingHttpResponse)
    assert response["Content-Type"].startswith("text/csv")
    assert 'filename="orders.csv"' in response["Content-Disposition"]
    rows = rows_of(response)
    assert iterations == [2]  # read from a cursor, two rows at a time
    assert rows[0][:3] == ["number", "id", "created_at"]
    assert sorted(int(r[0]) for r in rows[1:]) == sorted(o.number for o in orders)
    assert {r[6] for r in rows[1:]} == {"alice@example.com"}


def test_orders_export_is_the_list_as_searched(admin_browser, orders):
    response = admin_browser.get("/admin/orders/order/export.csv", {"q": str(orders[2].number)})
    assert [int(r[0]) for r in rows_of(response)[1:]] == [orders[2].number]


def test_the_changelist_links_to_its_export_with_its_query(admin_browser, orders):
    page = admin_browser.get("/admin/orders/order/", {"status__exact": "payment_pending"})
    assert b"/admin/orders/order/export.csv?status__exact=payment_pending" in page.content


def test_refunds_and_sales_reports_export(admin_browser, iterations):
    DailySalesReport.objects.create(
        date=datetime.date(2026, 5, 1),
        orders=3,
        units=4,
        revenue=Decimal("40.00"),
        refunds=Decimal("5.00"),
        returns=1,
        currency="EUR",
        content_hash="a" * 64,
    )
    reports = rows_of(admin_browser.get("/admin/reports/dailysalesreport/export.csv"))
    assert reports[0][:3] == ["date", "orders", "units"]
    assert reports[1][:7] == ["2026-05-01", "3", "4", "40.00", "5.00", "1", "EUR"]
    refunds = admin_browser.get("/admin/payments/refund/export.csv")
    assert isinstance(refunds, StreamingHttpResponse)
    assert rows_of(refunds)[0][:3] == ["id", "created_at", "order"]
    assert iterations == [admin_export.CHUNK_SIZE] * 2


def test_staff_without_view_permission_get_403(make_user, orders):
    staff = browser_for(make_user(staff=True))
    assert staff.get("/admin/orders/order/export.csv").status_code == 403
    viewer = make_user(staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_order"))
    assert browser_for(viewer).get("/admin/orders/order/export.csv").status_code == 200


def test_cells_a_spreadsheet_would_run_are_written_as_text():
    assert csv_cell("=HYPERLINK(1)") == "'=HYPERLINK(1)"
    assert csv_cell("@sum") == "'@sum"
    assert csv_cell(None) == ""
    assert csv_cell(Decimal("-1.00")) == Decimal("-1.00")  # numbers stay numbers
