"""Every closed day is reported, once: missed days are made by the next run, oldest first.

docs/reports.md, "Every closed day, once (catch-up)". The run (`reports.make_days`,
beat) opens a due row per closed day (`reports.models.ReportDay`) from the first
day with orders, and makes every day not yet published, oldest first; a day
past its attempt budget waits in "Needs attention" with an action that ends it.
"""

from __future__ import annotations

import re
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.test import Client

from backoffice import needs_attention
from config.celery import app
from orders.models import Order, OrderEvent
from orders.services import order_hold
from reports import pipeline
from reports.models import DailySalesReport, ReportDay
from tests.orders.conftest import ADDRESS, line_requests
from tests.orders.shipping import confirm

PAGE = "/admin/needs-attention/"


def at(day: date, hour: int) -> datetime:
    return datetime.combine(day, time(hour), tzinfo=ZoneInfo(settings.TIME_ZONE))


@pytest.fixture
def sell(make_product, shopper):
    """Sell `units` of a mug in one order created and paid at `when` (the shop's zone)."""
    make_product("MUG", price="7.50", stock=1000)

    def sold(units: int, when: datetime) -> Order:
        order = confirm(
            order_hold(
                owner=shopper,
                lines=line_requests({"MUG": units}),
                on_shortage="reject",
                payment_method="pm_card_ok",
                shipping_address=ADDRESS,
            )
        )
        Order.objects.filter(id=order.id).update(created_at=when)
        OrderEvent.objects.filter(order=order, kind="paid").update(created_at=when)
        return order

    return sold


@pytest.fixture(autouse=True)
def made_at_once(settings):
    """Days are made as soon as they close (no grace for late commits) in these tests."""
    settings.REPORTS_DAY_GRACE = 0.0


def run_beat() -> list[str]:
    """Run beat's report entry once, in this process, as a worker would."""
    app.loader.import_default_modules()
    (entry,) = [
        e
        for e in settings.CELERY_BEAT_SCHEDULE.values()
        if app.amqp.router.route({}, e["task"])["queue"].name == "reports"
    ]
    return app.tasks[entry["task"]].apply(throw=True).get()


@pytest.fixture
def made(monkeypatch) -> list[date]:
    """Every day the pipeline runs for, in order."""
    calls: list[date] = []
    real = pipeline.run

    def spy(*, day: date, from_step: str = "extract"):
        calls.append(day)
        return real(day=day, from_step=from_step)

    monkeypatch.setattr(pipeline, "run", spy)
    return calls


@pytest.mark.django_db
def test_workers_down_for_three_days_the_next_run_makes_each_day_once_oldest_first(sell, made):
    yesterday = pipeline.last_closed_day()
    missed = [yesterday - timedelta(days=n) for n in (2, 1, 0)]
    for units, day in enumerate(missed, start=1):
        sell(units, at(day, 12))

    assert run_beat() == [d.isoformat() for d in missed]

    assert made == missed  # oldest first, each once
    reports = list(DailySalesReport.objects.order_by("date"))
    assert [(r.date, r.units, r.revision) for r in reports] == [
        (day, units, 1) for units, day in enumerate(missed, start=1)
    ]
    assert [r.published_at for r in reports] == sorted(r.published_at for r in reports)
    rows = ReportDay.objects.order_by("date")
    assert [(r.date, r.attempts, r.done_at is not None) for r in rows] == [
        (day, 1, True) for day in missed
    ]

    # The next run (and the one after): nothing left to make, nothing doubled.
    assert run_beat() == [] and run_beat() == []
    assert made == missed
    assert DailySalesReport.objects.count() == 3
    assert set(DailySalesReport.objects.values_list("revision", flat=True)) == {1}


@pytest.mark.django_db
def test_the_yesterday_only_twin_loses_the_missed_days(sell, made, monkeypatch):
    """The old nightly task's rule (make yesterday only) run through the same checks:
    the two days the workers missed are never made."""
    from reports import days

    yesterday = pipeline.last_closed_day()
    missed = [yesterday - timedelta(days=n) for n in (2, 1, 0)]
    for day in missed:
        sell(1, at(day, 12))
    monkeypatch.setattr(days, "first_day", lambda *, last: last)

    run_beat()
    run_beat()

    assert made == [yesterday]
    assert list(DailySalesReport.objects.values_list("date", flat=True)) == [yesterday]


@pytest.mark.django_db
def test_days_before_the_first_order_are_not_made_and_published_days_are_not_made_again(sell, made):
    yesterday = pipeline.last_closed_day()
    first = yesterday - timedelta(days=3)
    sell(2, at(first, 9))
    pipeline.run(day=first + timedelta(days=1))  # published by hand (the command) already
    made.clear()

    run_beat()

    assert made == [first, first + timedelta(days=2), yesterday]
    assert ReportDay.objects.filter(date__lt=first).count() == 0
    assert not ReportDay.objects.filter(done_at__isnull=True).exists()
    assert DailySalesReport.objects.count() == 4


@pytest.mark.django_db
def test_the_first_day_setting_bounds_the_catch_up(sell, made, settings):
    yesterday = pipeline.last_closed_day()
    sell(1, at(yesterday - timedelta(days=5), 9))
    settings.REPORTS_FIRST_DAY = yesterday - timedelta(days=1)
    run_beat()
    assert made == [yesterday - timedelta(days=1), yesterday]


@pytest.mark.django_db
def test_a_day_not_yet_past_its_grace_waits_for_a_later_run(sell, made, settings):
    yesterday = pipeline.last_closed_day()
    sell(1, at(yesterday, 9))
    settings.REPORTS_DAY_GRACE = 2 * 24 * 3600.0  # yesterday closed less than two days ago
    assert run_beat() == []
    assert made == [] and ReportDay.objects.get(date=yesterday).done_at is None


# --- past the attempt budget: Needs attention, and the action that ends it -----------


@pytest.fixture
def failing(monkeypatch):
    """The pipeline fails for the days in the returned set."""
    broken: set[date] = set()
    real = pipeline.run

    def run(*, day: date, from_step: str = "extract"):
        if day in broken:
            raise RuntimeError(f"extract failed for {day}: disk full")
        return real(day=day, from_step=from_step)

    monkeypatch.setattr(pipeline, "run", run)
    return broken


def due_now() -> None:
    """Skip the backoff: every pending day is due now (the database clock)."""
    from django.db.models.functions import Now

    ReportDay.objects.filter(done_at__isnull=True).update(next_attempt_at=Now())


@pytest.fixture
def superuser(make_user):
    user = make_user(staff=True, username="boss")
    user.is_superuser = True
    user.save()
    client = Client()
    client.force_login(user)
    return client


def report_day_forms(page) -> list[dict]:
    found = []
    for body in re.findall(r"<form method=\"post\".*?</form>", page.content.decode(), re.S):
        fields = dict(re.findall(r'name="(\w+)" value="([^"]*)"', body))
        fields.pop("csrfmiddlewaretoken", None)
        if fields.get("kind") == "report_day":
            found.append(fields)
    return found


@pytest.mark.django_db
def test_a_day_past_its_budget_needs_attention_and_retry_now_makes_it(
    sell, failing, settings, superuser, monkeypatch, django_capture_on_commit_callbacks
):
    settings.REPORTS_DAY_MAX_ATTEMPTS = 2
    yesterday = pipeline.last_closed_day()
    bad = yesterday - timedelta(days=1)
    sell(1, at(bad, 9))
    sell(2, at(yesterday, 9))
    failing.add(bad)

    for _ in range(3):  # two attempts, then the budget is spent
        run_beat()
        due_now()

    row = ReportDay.objects.get(date=bad)
    assert (row.attempts, row.needs_attention, row.done_at) == (2, True, None)
    assert "disk full" in row.last_error
    # A day failing holds back no other day.
    assert DailySalesReport.objects.get(date=yesterday).units == 2
    assert needs_attention.needs_attention_counts()["report_day"] == 1

    page = superuser.get(PAGE)
    html = page.content.decode()
    assert f"sales report of {bad.isoformat()}" in html and "disk full" in html
    (form,) = report_day_forms(page)
    assert form["action"] == "retry"
    # The item links the day's row, listed read-only in the admin.
    assert f"/admin/reports/reportday/{row.pk}/change/" in html
    assert superuser.get(f"/admin/reports/reportday/{row.pk}/change/").status_code == 200
    assert superuser.get("/admin/reports/reportday/?needs_attention__exact=1").status_code == 200

    rung: list = []
    monkeypatch.setattr(app, "send_task", lambda name, *a, **kw: rung.append(name))
    failing.clear()  # the cause is fixed
    with django_capture_on_commit_callbacks(execute=True):
        answers = [superuser.post(PAGE, form) for _ in range(2)]  # a double click
    assert {a.status_code for a in answers} == {303}
    shown = superuser.get(answers[0]["Location"]).content.decode()
    assert "Retry now: done." in shown
    assert f'data-kind="report_day" data-pk="{row.pk}"' not in shown  # the item has ended
    assert needs_attention.needs_attention_counts()["report_day"] == 0

    # The action rang the run (once, after its commit); the run makes the day.
    assert rung == ["reports.make_days"]
    assert run_beat() == [bad.isoformat()]
    report = DailySalesReport.objects.get(date=bad)
    assert (report.units, report.revision) == (1, 1)
    row.refresh_from_db()
    assert row.done_at is not None and not row.needs_attention


@pytest.mark.django_db
def test_view_only_staff_see_a_report_day_but_cannot_retry_it(make_user, sell, failing, settings):
    settings.REPORTS_DAY_MAX_ATTEMPTS = 1
    yesterday = pipeline.last_closed_day()
    sell(1, at(yesterday, 9))
    failing.add(yesterday)
    run_beat()
    due_now()
    run_beat()
    row = ReportDay.objects.get(date=yesterday)
    assert row.needs_attention

    viewer = make_user(staff=True, username="viewer")
    viewer.user_permissions.add(
        Permission.objects.get(content_type__app_label="reports", codename="view_reportday")
    )
    client = Client()
    client.force_login(viewer)
    page = client.get(PAGE)
    assert f'data-kind="report_day" data-pk="{row.pk}"' in page.content.decode()
    assert report_day_forms(page) == []
    form = {
        "kind": "report_day",
        "pk": str(row.pk),
        "action": "retry",
        "idempotency_key": needs_attention.action_key(
            kind="report_day", pk=str(row.pk), action="retry", state="x"
        ),
    }
    assert client.post(PAGE, form).status_code == 403
    assert ReportDay.objects.get(pk=row.pk).needs_attention


@pytest.mark.django_db(transaction=True)
def test_two_runs_at_once_make_each_day_once(sell, made):
    from tests.orders.test_beat_on_two_hosts import twice_at_once

    yesterday = pipeline.last_closed_day()
    missed = [yesterday - timedelta(days=n) for n in (3, 2, 1, 0)]
    for day in missed:
        sell(1, at(day, 12))
    results = twice_at_once("reports.make_days")
    assert sorted(d for result in results for d in result) == [d.isoformat() for d in missed]
    assert sorted(made) == missed  # each day made by one of the two runs
    assert set(ReportDay.objects.values_list("attempts", flat=True)) == {1}
    assert DailySalesReport.objects.count() == 4


def test_beat_runs_the_catch_up_often_on_the_reports_queue():
    (entry,) = [
        e for e in settings.CELERY_BEAT_SCHEDULE.values() if e["task"] == "reports.make_days"
    ]
    assert entry["schedule"] <= 3600  # a missed day is made within the hour, not next night
    assert entry["options"]["expires"] <= entry["schedule"]
