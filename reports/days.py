"""Every closed day is reported, once: a due row per day, made by the run, oldest first.

docs/reports.md, "Every closed day, once (catch-up)". A day is a due row
(`reports.models.ReportDay`, `core.due`); nothing depends on one night's tick:

    days_open      open a row for every closed day from the first day on (one statement;
                   the day's unique constraint decides between two runs), due once the
                   day has been closed for REPORTS_DAY_GRACE (database clock, TIME_ZONE)
    days_make      the run (beat's `reports.make_days`): open, then make every due day,
                   oldest first, until REPORTS_RUN_BUDGET; a day that fails holds back
                   no other day
    day_make       one attempt at one day: `attempt_begin`, the pipeline, and the publish
                   marks the row done in its transaction; a failure is recorded, retried
                   after the backoff, and past REPORTS_DAY_MAX_ATTEMPTS needs attention
    day_retry_now  staff ("Needs attention"): a fresh budget, due now, the run rung
"""

from __future__ import annotations

import logging
import time
from datetime import date

from django.conf import settings
from django.db import connection, transaction
from django.db.models.functions import Now

from core import due
from orders import selectors as order_selectors

from . import pipeline
from .models import REPORT_DAY_CONSTRAINT, DailySalesReport, ReportDay

logger = logging.getLogger(__name__)


def first_day(*, last: date) -> date:
    """The first day reported: REPORTS_FIRST_DAY, else the earliest of the first order's day,
    the oldest report and the oldest day row; with none of them, `last` (yesterday)."""
    if settings.REPORTS_FIRST_DAY is not None:
        return settings.REPORTS_FIRST_DAY
    candidates = [last]
    for oldest in (
        ReportDay.objects.order_by("date").values_list("date", flat=True).first(),
        DailySalesReport.objects.order_by("date").values_list("date", flat=True).first(),
    ):
        if oldest is not None:
            candidates.append(oldest)
    first_order = order_selectors.first_order_at()
    if first_order is not None:
        candidates.append(first_order.astimezone(pipeline.shop_zone()).date())
    return min(candidates)


# A day's row is due REPORTS_DAY_GRACE after the day's end in the shop's zone; a day
# published already (by the command, or before the rows existed) is opened done.
_OPEN_SQL = f"""
INSERT INTO {ReportDay._meta.db_table} (date, next_attempt_at, done_at)
SELECT days.d,
       greatest(now(), ((days.d + 1)::timestamp AT TIME ZONE %s) + make_interval(secs => %s)),
       (SELECT r.published_at FROM {DailySalesReport._meta.db_table} r WHERE r.date = days.d)
FROM (SELECT g::date AS d FROM generate_series(%s::date, %s::date, interval '1 day') AS g) days
WHERE NOT EXISTS (SELECT 1 FROM {ReportDay._meta.db_table} x WHERE x.date = days.d)
ORDER BY days.d
ON CONFLICT ON CONSTRAINT {REPORT_DAY_CONSTRAINT} DO NOTHING
RETURNING date
"""


def days_open() -> list[date]:
    """Open a due row for every closed day from the first day on; return the days opened."""
    last = pipeline.last_closed_day()
    first = first_day(last=last)
    if first > last:
        return []
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            _OPEN_SQL, [settings.TIME_ZONE, float(settings.REPORTS_DAY_GRACE), first, last]
        )
        return sorted(row[0] for row in cursor.fetchall())


def day_make(*, pk: int, day: date) -> bool:
    """One attempt at making `day` (its row `pk`); return True if this attempt published it."""
    attempt = due.attempt_begin(ReportDay, pk=pk)
    if attempt.budget_spent:  # the last attempt died without a word (a killed worker)
        budget = ReportDay.due_policy().max_attempts
        due.flag_attention(
            ReportDay,
            pk=pk,
            reason=f"attempt budget spent ({budget} attempts): the last attempt did not end",
            only_if_attempts_at_least=budget,
        )
        return False
    if not attempt.taken:
        return False  # another run holds it, or it is done
    try:
        pipeline.run(day=day)
    except Exception as exc:  # noqa: BLE001 - any failure is this attempt's: recorded, retried
        ended = due.attempt_failed(
            ReportDay, pk=pk, error=f"{type(exc).__name__}: {exc}", attempt=attempt
        )
        log = logger.error if ended else logger.warning
        log("sales report of %s failed (attempt %d): %s", day, attempt.number, exc)
        return False
    return True


def days_make(*, budget: float | None = None) -> list[date]:
    """The run: open the closed days, then make every due day, oldest first; return those made.

    Starts no further day once `budget` seconds (REPORTS_RUN_BUDGET) have passed:
    the next run goes on. A day another run holds is skipped, not waited for.
    """
    days_open()
    seconds = settings.REPORTS_RUN_BUDGET if budget is None else budget
    deadline = time.monotonic() + seconds  # a local time budget, not a decision on shared time
    made: list[date] = []
    tried: list[int] = []
    while time.monotonic() < deadline:
        row = (
            ReportDay.objects.pending()
            .filter(next_attempt_at__lte=Now())
            .exclude(pk__in=tried)
            .order_by("date")
            .values_list("pk", "date")
            .first()
        )
        if row is None:
            break
        pk, day = row
        tried.append(pk)
        if day_make(pk=pk, day=day):
            made.append(day)
    return made


@transaction.atomic
def day_retry_now(*, day_id: int, by=None) -> bool:
    """Staff: give a day that needs attention a fresh budget, due now, and ring the run."""
    reopened = due.retry_now(ReportDay, pk=day_id)
    if reopened:
        logger.info("report day %s retried by %s", day_id, getattr(by, "pk", None))
    return reopened
