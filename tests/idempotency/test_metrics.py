"""Duplicate counts live in the database, one upsert per event, and lose nothing under races."""

from __future__ import annotations

import logging
import threading

import pytest
from django.db import connection, transaction

from core.logging import key_hash
from idempotency import metrics
from idempotency.messaging.inbox import inbox_claim
from idempotency.models import DuplicateCount
from tests.concurrency import Workers


def total(mechanism: str, *, suspicious: bool | None = None) -> int:
    rows = DuplicateCount.objects.filter(mechanism=mechanism)
    if suspicious is not None:
        rows = rows.filter(suspicious=suspicious)
    return sum(rows.values_list("count", flat=True))


@pytest.mark.django_db
def test_counted_per_day_and_mechanism_suspicious_apart(caplog):
    caplog.set_level(logging.INFO, logger="shop.duplicates")
    metrics.duplicate_suppressed(mechanism=metrics.INBOX_DUPLICATE, consumer="c", message_id="m")
    metrics.duplicate_suppressed(mechanism=metrics.INBOX_DUPLICATE, consumer="c", message_id="m")
    metrics.duplicate_suppressed(
        mechanism=metrics.INBOX_DUPLICATE, suspicious=True, consumer="c", message_id="m"
    )
    rows = {
        (r.mechanism, r.suspicious): r for r in DuplicateCount.objects.all()
    }  # one row per (day, mechanism, suspicious)
    assert rows[(metrics.INBOX_DUPLICATE, False)].count == 2
    assert rows[(metrics.INBOX_DUPLICATE, True)].count == 1
    assert len({r.day for r in rows.values()}) == 1
    assert metrics.duplicate_totals()[metrics.INBOX_DUPLICATE] == 3
    assert metrics.suspicious_totals()[metrics.INBOX_DUPLICATE] == 1
    assert metrics.duplicate_totals()[metrics.KEY_REPLAY] == 0  # every mechanism is present

    lines = [r for r in caplog.records if r.name == "shop.duplicates"]
    assert [r.levelno for r in lines] == [logging.INFO, logging.INFO, logging.WARNING]
    assert lines[0].mechanism == metrics.INBOX_DUPLICATE
    assert (lines[0].consumer, lines[0].message_id) == ("c", "m")
    assert lines[2].suspicious is True


@pytest.mark.django_db
def test_a_key_is_logged_as_its_hash(caplog):
    caplog.set_level(logging.INFO, logger="shop.duplicates")
    metrics.duplicate_suppressed(mechanism=metrics.KEY_REPLAY, key="the-secret-key-123")
    (record,) = [r for r in caplog.records if r.name == "shop.duplicates"]
    assert record.idempotency_key_hash == key_hash("the-secret-key-123")
    assert "the-secret-key-123" not in repr(vars(record))


@pytest.mark.django_db
def test_one_statement_per_count(django_assert_num_queries):
    with django_assert_num_queries(1) as captured:
        metrics.duplicate_count(mechanism=metrics.PROCESSED_ID)
    sql = captured.captured_queries[0]["sql"]
    assert "ON CONFLICT" in sql and "SAVEPOINT" not in sql
    with django_assert_num_queries(1):
        metrics.duplicate_count(mechanism=metrics.PROCESSED_ID, amount=4)
    assert total(metrics.PROCESSED_ID) == 5


@pytest.mark.django_db
def test_unknown_mechanism_is_refused():
    with pytest.raises(ValueError):
        metrics.duplicate_suppressed(mechanism="request_key")


@pytest.mark.django_db
def test_conflict_totals_come_from_the_key_mechanisms():
    metrics.duplicate_suppressed(mechanism=metrics.KEY_IN_USE)
    metrics.duplicate_suppressed(mechanism=metrics.KEY_REUSED, suspicious=True)
    metrics.duplicate_suppressed(mechanism=metrics.KEY_REUSED, suspicious=True)
    assert metrics.conflict_totals() == {"idempotency_key_in_use": 1, "idempotency_key_reused": 2}


@pytest.mark.django_db
def test_the_old_counter_names_still_count():
    metrics.count("shop_duplicates_suppressed_total", mechanism="request_key")
    metrics.count("shop_duplicates_suppressed_total", mechanism="inbox")
    metrics.count("shop_idempotency_key_conflicts_total", code="idempotency_key_in_use")
    totals = metrics.duplicate_totals()
    assert (totals[metrics.KEY_REPLAY], totals[metrics.INBOX_DUPLICATE]) == (1, 1)
    assert totals[metrics.KEY_IN_USE] == 1


# --- transactions -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_counted_after_commit_and_gone_with_a_rollback():
    with transaction.atomic():
        assert inbox_claim(consumer="c", message_id="m1") is True
    with transaction.atomic():
        assert inbox_claim(consumer="c", message_id="m1") is False
        # Deferred to the commit: the counter row is not locked by this transaction.
        assert total(metrics.INBOX_DUPLICATE) == 0
    assert total(metrics.INBOX_DUPLICATE) == 1

    with pytest.raises(ZeroDivisionError), transaction.atomic():
        assert inbox_claim(consumer="c", message_id="m1") is False
        1 / 0  # noqa: B018 - the consumer's effect fails: its work did not stand
    assert total(metrics.INBOX_DUPLICATE) == 1


@pytest.mark.django_db(transaction=True)
def test_a_failing_count_never_fails_the_caller(monkeypatch, caplog):
    monkeypatch.setattr(metrics, "_UPSERT", "INSERT INTO no_such_table VALUES (%s, %s, %s)")
    metrics.duplicate_suppressed(mechanism=metrics.KEY_REPLAY)
    with transaction.atomic():
        metrics.duplicate_suppressed(mechanism=metrics.KEY_REPLAY)
    assert "duplicate not counted" in caplog.text
    with connection.cursor() as cursor:  # the connection is still usable
        cursor.execute("SELECT 1")


# --- races ----------------------------------------------------------------------

THREADS = 6
ROUNDS = 5


def _read_modify_write(mechanism: str) -> None:
    """The WRONG way: read the count, then write count + 1 (loses concurrent increments)."""
    row = DuplicateCount.objects.get(mechanism=mechanism)
    seen = DuplicateCount.objects.get(pk=row.pk).count
    _barrier.wait()  # every thread has read the same value
    DuplicateCount.objects.filter(pk=row.pk).update(count=seen + 1)
    _barrier.wait()


_barrier = threading.Barrier(THREADS, timeout=30)


def _race(target, *args) -> None:
    workers = Workers()
    for _ in range(THREADS):
        workers.start(target, *args)
    workers.join()


@pytest.mark.django_db(transaction=True)
def test_concurrent_counts_lose_nothing():
    def count_rounds() -> None:
        for _ in range(ROUNDS):
            _barrier.wait()  # all threads upsert the same row at the same moment
            metrics.duplicate_suppressed(mechanism=metrics.UNIQUE_CONSTRAINT)

    _barrier.reset()
    _race(count_rounds)
    assert total(metrics.UNIQUE_CONSTRAINT) == THREADS * ROUNDS
    assert DuplicateCount.objects.filter(mechanism=metrics.UNIQUE_CONSTRAINT).count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_read_modify_write_twin_loses_counts():
    """The control: the same race with a read-modify-write counter loses increments."""
    DuplicateCount.objects.create(day="2000-01-01", mechanism="twin", suspicious=False, count=0)

    def rounds() -> None:
        for _ in range(ROUNDS):
            _read_modify_write("twin")

    _barrier.reset()
    _race(rounds)
    assert DuplicateCount.objects.get(mechanism="twin").count == ROUNDS  # not THREADS * ROUNDS


# --- the admin's Duplicates page --------------------------------------------------


@pytest.fixture
def superuser_browser(client, make_user):
    staff = make_user(staff=True)
    staff.is_superuser = True
    staff.save()
    client.force_login(staff)
    return client


@pytest.mark.django_db
def test_duplicates_page_has_a_chart_per_mechanism(superuser_browser):
    import datetime

    from django.utils import timezone

    today = timezone.now().date()
    DuplicateCount.objects.create(day=today, mechanism=metrics.KEY_REPLAY, count=7)
    DuplicateCount.objects.create(
        day=today - datetime.timedelta(days=3),
        mechanism=metrics.KEY_REUSED,
        suspicious=True,
        count=2,
    )
    index = superuser_browser.get("/admin/").content.decode()
    assert 'href="/admin/idempotency/duplicatecount/"' in index and "Duplicates" in index

    response = superuser_browser.get("/admin/idempotency/duplicatecount/")
    assert response.status_code == 200
    page = response.content.decode()
    charts = page.split('<div class="dup-charts">', 1)[1].split("</div>", 1)[0]
    figures = charts.split('<figure class="dup-chart">')[1:]
    assert len(figures) == len(metrics.MECHANISMS)
    assert all("<svg" in figure and "</svg>" in figure for figure in figures)
    assert "key_replay: 7" in page and "key_reused: 2 (2 suspicious)" in page
    assert f"{today:%Y-%m-%d}: 7" in page  # the bar's tooltip
    assert 'class="bad"' in page  # the suspicious bar, stacked apart
    assert "<script" not in charts
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert superuser_browser.get("/admin/idempotency/duplicatecount/add/").status_code == 403


@pytest.mark.django_db
def test_chart_scales_each_mechanism_to_its_peak():
    import datetime

    from idempotency.admin import duplicate_charts

    day = datetime.date(2030, 1, 10)
    DuplicateCount.objects.create(day=day, mechanism=metrics.INBOX_DUPLICATE, count=4)
    DuplicateCount.objects.create(
        day=day - datetime.timedelta(days=1), mechanism=metrics.INBOX_DUPLICATE, count=2
    )
    (chart,) = [
        c for c in duplicate_charts(days=5, today=day) if c["mechanism"] == "inbox_duplicate"
    ]
    assert [b["ok"] for b in chart["bars"]] == [0, 0, 0, 2, 4]
    assert chart["bars"][-1]["ok_h"] == chart["height"] and chart["bars"][-1]["ok_y"] == 0
    assert chart["bars"][-2]["ok_h"] == chart["height"] / 2
