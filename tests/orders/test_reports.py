"""The daily sales report: re-runnable steps, one published report per day, revisions."""

from __future__ import annotations

import re
import threading
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection

from core.db import database_now
from idempotency import failpoints
from orders.models import OrderEvent
from reports import pipeline
from reports.models import DailySalesReport, ReportAggregate, ReportExtractRow
from tests.concurrency import Workers
from tests.conftest import assert_problem
from tests.orders.shipping import confirm
from tests.support.servers import wait_until

URL = "/api/v1/reports/daily-sales/"


def closed_day(days_ago: int = 2) -> date:
    return pipeline.last_closed_day() - timedelta(days=days_ago - 1)


def at(day: date, hour: int, minute: int = 0, zone: str = "UTC") -> datetime:
    return datetime.combine(day, time(hour, minute), tzinfo=ZoneInfo(zone))


@pytest.fixture
def sell(make_product, reserve):
    """Sell `lines` {sku: qty} in one order paid at `when`."""
    make_product("TEE-M", price="19.99", stock=1000)
    make_product("MUG", price="7.50", stock=1000)

    def sold(lines: dict[str, int], when: datetime):
        order = confirm(reserve(lines))
        OrderEvent.objects.filter(order=order, kind="paid").update(created_at=when)
        return order

    return sold


@pytest.fixture
def day_sales(sell):
    day = closed_day()
    sell({"TEE-M": 2, "MUG": 1}, at(day, 0, 5))
    sell({"MUG": 3}, at(day, 23, 59))
    sell({"TEE-M": 1}, at(day - timedelta(days=1), 23, 59))  # the day before
    sell({"TEE-M": 5}, at(day + timedelta(days=1), 0, 0))  # the day after
    return day


EXPECTED = {"orders": 2, "units": 6, "revenue": "69.98", "refunds": "0.00", "returns": 0}


def figures(report) -> dict:
    return {k: v for k, v in pipeline.figures_of(report).items() if k in EXPECTED}


@pytest.mark.django_db
def test_a_clean_run_publishes_the_days_figures(day_sales, staff_client):
    report = pipeline.run(day=day_sales)
    assert figures(report) == EXPECTED
    assert report.revision == 1 and report.replaced_at is None
    assert report.content_hash == pipeline.content_hash(pipeline.figures_of(report))
    body = staff_client.get(URL).json()
    assert body == {
        "results": [
            {
                "date": day_sales.isoformat(),
                "orders": 2,
                "units": 6,
                "revenue": "69.98",
                "refunds": "0.00",
                "returns": 0,
                "currency": "EUR",
                "content_hash": report.content_hash,
                "published_at": body["results"][0]["published_at"],
            }
        ],
        "next": None,
    }


@pytest.mark.django_db
def test_list_is_newest_first_and_staff_only(sell, staff_client, shopper_client):
    days = [closed_day(n) for n in (5, 3, 4)]
    for day in days:
        sell({"MUG": 1}, at(day, 12))
        pipeline.run(day=day)
    first = staff_client.get(URL + "?page_size=2").json()
    second = staff_client.get(first["next"]).json()
    dates = [r["date"] for r in first["results"] + second["results"]]
    assert dates == sorted((d.isoformat() for d in days), reverse=True)
    assert second["next"] is None
    assert_problem(shopper_client.get(URL), 403, "permission_denied")


@pytest.mark.django_db
def test_the_day_is_the_shops_time_zone(sell, settings):
    settings.TIME_ZONE = "Europe/Berlin"
    day = closed_day(3)
    sell({"MUG": 1}, at(day, 23, 30, "UTC"))  # 00:30 the next day in Berlin: not this day
    sell({"MUG": 2}, at(day - timedelta(days=1), 23, 30, "UTC"))  # 00:30 this day in Berlin
    sell({"TEE-M": 1}, at(day, 12, 0, "Europe/Berlin"))
    report = pipeline.run(day=day)
    assert (report.orders, report.units) == (2, 3)


@pytest.mark.django_db
def test_a_day_not_closed_is_refused(staff_client):
    today = database_now().astimezone(ZoneInfo(settings.TIME_ZONE)).date()
    with pytest.raises(pipeline.ReportDayNotClosed, match="not closed yet"):
        pipeline.run(day=today)
    with pytest.raises(CommandError, match="not closed yet"):
        call_command("sales_report", "--date", today.isoformat())
    with pytest.raises(CommandError, match="not closed yet"):
        call_command(
            "sales_report",
            "--from",
            (today - timedelta(days=3)).isoformat(),
            "--to",
            today.isoformat(),
        )
    assert not DailySalesReport.objects.exists() and not ReportExtractRow.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "args", [[], ["--date", "2026-02-30"], ["--date", "2026-01-01", "--from", "2026-01-01"]]
)
def test_command_refuses_bad_arguments(args):
    with pytest.raises(CommandError):
        call_command("sales_report", *args)


@pytest.mark.django_db
def test_command_runs_a_range_with_progress(sell, capsys):
    days = [closed_day(n) for n in (4, 3, 2)]
    for index, day in enumerate(days):
        sell({"MUG": index + 1}, at(day, 9))
    call_command("sales_report", "--from", days[0].isoformat(), "--to", days[-1].isoformat())
    out, err = capsys.readouterr()
    assert "9/9" in err and "published" in err
    assert out.count("revision 1") == 3
    assert [r.units for r in DailySalesReport.objects.order_by("date")] == [1, 2, 3]


@pytest.mark.django_db
@pytest.mark.parametrize("step", pipeline.STEPS)
def test_a_crash_after_any_step_then_a_rerun_from_it_gives_the_clean_hash(
    day_sales, step, monkeypatch
):
    clean = pipeline.run(day=day_sales)
    DailySalesReport.objects.all().delete()
    ReportAggregate.objects.all().delete()
    ReportExtractRow.objects.all().delete()

    monkeypatch.setenv("SHOP_FAILPOINTS", f"report.{step}.after=raise")
    with pytest.raises(failpoints.FailpointError):
        pipeline.run(day=day_sales)
    monkeypatch.delenv("SHOP_FAILPOINTS")
    rerun = pipeline.run(day=day_sales, from_step=step)
    assert rerun.content_hash == clean.content_hash
    assert rerun.revision == 1  # the crashed publish (if any) already had these figures
    assert ReportExtractRow.objects.count() == 3  # rewritten, never doubled
    # And from every earlier step, too.
    for earlier in pipeline.STEPS[: pipeline.STEPS.index(step)]:
        assert pipeline.run(day=day_sales, from_step=earlier).content_hash == clean.content_hash
    assert DailySalesReport.objects.get().revision == 1


@pytest.mark.django_db
def test_new_data_for_a_past_day_replaces_the_figures_as_a_new_revision(
    day_sales, sell, staff_browser
):
    first = pipeline.run(day=day_sales)
    assert pipeline.run(day=day_sales).revision == 1  # same figures: nothing new
    sell({"TEE-M": 1}, at(day_sales, 15))  # late data for that day
    second = pipeline.run(day=day_sales)
    assert second.revision == 2 and second.replaced_at is not None
    assert second.previous_content_hash == first.content_hash != second.content_hash
    assert (second.orders, second.units) == (3, 7)
    assert DailySalesReport.objects.count() == 1

    page = staff_browser.get("/admin/reports/dailysalesreport/").content.decode()
    assert "Replaced: revision 2" in page
    assert "<svg" in page and "sales-chart-revenue" in page and "sales-chart-returns" in page
    assert "http://" not in page.split("<svg", 1)[1].split("</svg>", 1)[0].replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )
    detail = staff_browser.get(f"/admin/reports/dailysalesreport/{second.pk}/change/")
    assert "Replaced: revision 2" in detail.content.decode()


@pytest.fixture
def staff_browser(client, make_user):
    staff = make_user(staff=True)
    staff.is_superuser = True
    staff.save()
    client.force_login(staff)
    return client


@pytest.mark.django_db(transaction=True)
def test_two_runs_at_once_for_one_day_publish_one_report(day_sales):
    barrier = threading.Barrier(2)

    def run_once():
        barrier.wait(timeout=10)
        try:
            return pipeline.run(day=day_sales).content_hash
        finally:
            connection.close()

    workers = Workers()
    workers.start(run_once)
    workers.start(run_once)
    hashes = workers.join()
    assert len(set(hashes)) == 1
    report = DailySalesReport.objects.get()
    assert report.revision == 1 and figures(report) == EXPECTED
    assert ReportExtractRow.objects.count() == 3


@pytest.mark.django_db(transaction=True)
def test_the_date_unique_constraint_decides_without_the_lock(day_sales, monkeypatch):
    """Even two publishes that skip the day lock cannot make two rows for one day."""
    pipeline.run(day=day_sales, from_step="extract")
    monkeypatch.setattr(pipeline, "report_day_lock", lambda day: None)
    barrier = threading.Barrier(2)

    def publish():
        barrier.wait(timeout=10)
        try:
            return pipeline.publish(day=day_sales).pk
        finally:
            connection.close()

    workers = Workers()
    workers.start(publish)
    workers.start(publish)
    assert len(set(workers.join())) == 1
    assert DailySalesReport.objects.count() == 1


# --- a real worker process dying after each step ------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("step", pipeline.STEPS)
def test_worker_exits_after_a_step_then_the_rerun_gives_the_clean_hash(
    day_sales, step, celery_worker_process
):
    from reports.tasks import daily_sales_chain

    clean = pipeline.run(day=day_sales)
    DailySalesReport.objects.all().delete()
    ReportAggregate.objects.all().delete()
    ReportExtractRow.objects.all().delete()

    worker = celery_worker_process(failpoints=f"report.{step}.after=exit@1")
    daily_sales_chain(day_sales).apply_async()
    directory = worker.env["SHOP_FAILPOINTS_DIR"]
    wait_until(
        lambda: failpoints.hits(f"report.{step}.after", directory) == 1,
        timeout=60,
        message=worker.log(),
    )
    # The process died right after the step committed; re-run from that step.
    rerun = pipeline.run(day=day_sales, from_step=step)
    assert rerun.content_hash == clean.content_hash
    # The redelivered task (acks_late, reject_on_worker_lost) finishes the chain too.
    exit_line = f"failpoint report.{step}.after: exit"

    def chain_finished() -> bool:
        after_exit = worker.log().split(exit_line, 1)[-1]
        return re.search(r"Task reports\.publish\[[^\]]+\] succeeded", after_exit) is not None

    wait_until(chain_finished, timeout=90, message=worker.log())
    report = DailySalesReport.objects.get()
    assert report.content_hash == clean.content_hash and report.revision == 1
    assert ReportExtractRow.objects.count() == 3


@pytest.mark.django_db(transaction=True)
def test_refunds_and_returns_count_on_the_day_they_happened(
    provider, make_product, shopper_client, staff_client, monkeypatch
):
    from celery import current_app

    from orders.models import ReturnRequest
    from payments.models import Refund, RefundStatus
    from tests.orders.compensation_support import ask_return, drive, receive, shipped_order

    monkeypatch.setattr(current_app, "send_task", lambda *a, **kw: None)  # rows are the truth
    make_product("TEE-M", price="10.00", stock=10)
    make_product("CAP", price="5.50", stock=10)
    order = shipped_order(shopper_client, {"TEE-M": 2, "CAP": 1})
    return_id = ask_return(shopper_client, order, {"TEE-M": 2, "CAP": 1}).json()["id"]
    assert receive(staff_client, return_id).status_code == 202
    drive(order_return_id=return_id)
    refund = Refund.objects.get(payment=order.payment)
    assert refund.status == RefundStatus.SUCCEEDED and str(refund.amount) == "25.50"
    day = closed_day()
    ReturnRequest.objects.filter(id=return_id).update(received_at=at(day, 10))
    Refund.objects.filter(id=refund.id).update(updated_at=at(day, 11))
    OrderEvent.objects.filter(order=order, kind="paid").update(created_at=at(day, 9))

    report = pipeline.run(day=day)

    assert figures(report) == {
        "orders": 1,
        "units": 3,
        "revenue": "25.50",
        "refunds": "25.50",
        "returns": 3,
    }
    assert figures(pipeline.run(day=day - timedelta(days=1)))["refunds"] == "0.00"
