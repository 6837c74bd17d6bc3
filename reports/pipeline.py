"""The daily sales report: extract → aggregate → publish for one closed day (docs/reports.md).

A day is a calendar day in the shop's time zone (setting `TIME_ZONE`) and
is closed once the database clock has passed its end. Each step takes the
day's advisory lock, deletes its own output for the day and writes it
again, in one transaction; its failpoint `report.<step>.after` fires after
that commit. So a crash anywhere, followed by a re-run from the step that
crashed (or any earlier one), ends with exactly the figures, and the
content hash, of a clean run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Q, Sum

from core.db import database_now
from core.errors import ApplicationError
from core.money import format_money
from idempotency.failpoints import failpoint
from orders import selectors as order_selectors
from payments import selectors as payment_selectors

from .lock_objects import report_day_lock
from .models import (
    DAILY_SALES_DATE_CONSTRAINT,
    REPORT_DAY_CONSTRAINT,
    DailySalesReport,
    ReportAggregate,
    ReportDay,
    ReportExtractRow,
)

STEPS = ("extract", "aggregate", "publish")


class ReportDayNotClosed(ApplicationError):
    status = 400
    code = "day_not_closed"
    title = "Day not closed"


class ReportNotAggregated(ApplicationError):
    status = 409
    code = "report_not_aggregated"
    title = "Report not aggregated"


def shop_zone() -> ZoneInfo:
    return ZoneInfo(settings.TIME_ZONE)


def day_window(day: date) -> tuple[datetime, datetime]:
    """Return [start, end) of `day` in the shop's time zone (23 or 25 hours around DST)."""
    zone = shop_zone()
    start = datetime.combine(day, time.min, tzinfo=zone)
    end = datetime.combine(day + timedelta(days=1), time.min, tzinfo=zone)
    return start, end


def last_closed_day() -> date:
    """Return yesterday in the shop's time zone, by the database clock."""
    return database_now().astimezone(shop_zone()).date() - timedelta(days=1)


def check_closed(day: date) -> None:
    """Refuse a day that has not ended yet in the shop's time zone (database clock)."""
    _, end = day_window(day)
    now = database_now()
    if now < end:
        raise ReportDayNotClosed(
            f"{day.isoformat()} is not closed yet: it ends at {end.isoformat()} "
            f"({settings.TIME_ZONE}); it is now {now.astimezone(shop_zone()).isoformat()}.",
            extra={"date": day.isoformat(), "closes_at": end.isoformat()},
        )


# --- Extract -------------------------------------------------------------------------


def _sales(start: datetime, end: datetime) -> Iterator[ReportExtractRow]:
    """Lines of orders paid (confirmed) in [start, end): their confirmed units and amounts."""
    lines = order_selectors.paid_lines(start=start, end=end)
    for order_id, sku, units, unit_price in lines.iterator(chunk_size=2000):
        yield ReportExtractRow(
            source=ReportExtractRow.Source.SALE,
            order_id=order_id,
            sku=sku,
            units=units,
            amount=unit_price * units,
        )


def _refunds(start: datetime, end: datetime) -> Iterator[ReportExtractRow]:
    """Money that went back to shoppers in [start, end): succeeded refunds, per order.

    A refund counts on the day it succeeded: its terminal update (the money
    moved, or staff recorded it as refunded outside the shop) sets
    `updated_at`, and a succeeded refund is never updated again.
    """
    refunds = payment_selectors.refunds_succeeded_by_order(start=start, end=end)
    for row in refunds.iterator(chunk_size=2000):
        yield ReportExtractRow(
            source=ReportExtractRow.Source.REFUND,
            order_id=row["payment__order__id"],
            sku="",  # a refund is money for the order, not for one line
            units=0,
            amount=row["total"],
        )


def _returns(start: datetime, end: datetime) -> Iterator[ReportExtractRow]:
    """Units received back in [start, end): lines of returns received that day, per sku."""
    lines = order_selectors.returned_lines_by_sku(start=start, end=end)
    for row in lines.iterator(chunk_size=2000):
        yield ReportExtractRow(
            source=ReportExtractRow.Source.RETURN,
            order_id=row["order_return__order_id"],
            sku=row["sku"],
            units=row["units"],
            amount=row["amount"],
        )


# The extract's query, in one place: each source yields the day's facts.
EXTRACT_SOURCES = (_sales, _refunds, _returns)


@transaction.atomic
def _extract(day: date) -> int:
    report_day_lock(day=day)
    ReportExtractRow.objects.filter(date=day).delete()
    start, end = day_window(day)
    rows = []
    for source in EXTRACT_SOURCES:
        for row in source(start, end):
            row.date = day
            rows.append(row)
    ReportExtractRow.objects.bulk_create(rows, batch_size=2000)
    return len(rows)


def extract(*, day: date) -> int:
    """Step 1: rewrite the day's extract rows from the orders; return how many."""
    check_closed(day)
    count = _extract(day)
    failpoint("report.extract.after")
    return count


# --- Aggregate -----------------------------------------------------------------------


def content_hash(figures: dict) -> str:
    """SHA-256 of the published figures' canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(figures, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def figures_of(row) -> dict:
    """Return the published figures of an aggregate or report row (what the hash covers)."""
    return {
        "date": row.date.isoformat(),
        "orders": row.orders,
        "units": row.units,
        "revenue": format_money(row.revenue),
        "refunds": format_money(row.refunds),
        "returns": row.returns,
        "currency": row.currency,
    }


@transaction.atomic
def _aggregate(day: date) -> ReportAggregate:
    report_day_lock(day=day)
    ReportAggregate.objects.filter(date=day).delete()
    sale = Q(source=ReportExtractRow.Source.SALE)
    totals = ReportExtractRow.objects.filter(date=day).aggregate(
        n_orders=Count("order_id", filter=sale, distinct=True),
        n_units=Sum("units", filter=sale, default=0),
        n_revenue=Sum("amount", filter=sale, default=Decimal(0)),
        n_refunds=Sum(
            "amount", filter=Q(source=ReportExtractRow.Source.REFUND), default=Decimal(0)
        ),
        n_returns=Sum("units", filter=Q(source=ReportExtractRow.Source.RETURN), default=0),
    )
    aggregate = ReportAggregate(
        date=day,
        currency=settings.SHOP_CURRENCY,
        **{name.removeprefix("n_"): value for name, value in totals.items()},
    )
    aggregate.content_hash = content_hash(figures_of(aggregate))
    aggregate.save(force_insert=True)
    return aggregate


def aggregate(*, day: date) -> ReportAggregate:
    """Step 2: rewrite the day's figures (and their content hash) from the extract rows."""
    check_closed(day)
    result = _aggregate(day)
    failpoint("report.aggregate.after")
    return result


# --- Publish -------------------------------------------------------------------------

_PUBLISH_SQL = f"""
INSERT INTO {DailySalesReport._meta.db_table} AS r
    (date, orders, units, revenue, refunds, returns, currency, content_hash,
     revision, published_at, replaced_at, previous_content_hash)
SELECT date, orders, units, revenue, refunds, returns, currency, content_hash,
       1, now(), NULL, NULL
FROM {ReportAggregate._meta.db_table} WHERE date = %s
ON CONFLICT ON CONSTRAINT {DAILY_SALES_DATE_CONSTRAINT} DO UPDATE SET
    orders = EXCLUDED.orders, units = EXCLUDED.units, revenue = EXCLUDED.revenue,
    refunds = EXCLUDED.refunds, returns = EXCLUDED.returns, currency = EXCLUDED.currency,
    content_hash = EXCLUDED.content_hash, revision = r.revision + 1,
    replaced_at = now(), previous_content_hash = r.content_hash
WHERE r.content_hash <> EXCLUDED.content_hash
"""


# The day is made: its due row is done, in the publish's transaction, whoever ran it
# (the run, the command, a chain). A day not opened yet gets its row, done.
_DAY_DONE_SQL = f"""
INSERT INTO {ReportDay._meta.db_table} AS d (date, done_at) VALUES (%s, now())
ON CONFLICT ON CONSTRAINT {REPORT_DAY_CONSTRAINT} DO UPDATE SET
    done_at = now(), needs_attention = false, lease_owner = '', lease_expires_at = NULL,
    updated_at = now()
WHERE d.done_at IS NULL
"""


@transaction.atomic
def _publish(day: date) -> DailySalesReport:
    report_day_lock(day=day)
    with connection.cursor() as cursor:
        cursor.execute(_PUBLISH_SQL, [day])
    report = DailySalesReport.objects.filter(date=day).first()
    if report is None:
        raise ReportNotAggregated(f"{day.isoformat()} has no aggregate: run aggregate first.")
    with connection.cursor() as cursor:
        cursor.execute(_DAY_DONE_SQL, [day])
    return report


def publish(*, day: date) -> DailySalesReport:
    """Step 3: publish the day's figures; the same figures again change nothing.

    One row per day (a unique constraint decides, `INSERT ... ON CONFLICT`);
    different figures replace the published ones as a new revision.
    """
    check_closed(day)
    report = _publish(day)
    failpoint("report.publish.after")
    return report


STEP_FUNCTIONS = {"extract": extract, "aggregate": aggregate, "publish": publish}


def run(*, day: date, from_step: str = "extract") -> DailySalesReport:
    """Run the pipeline for one day in this process, from `from_step` on; return the report."""
    check_closed(day)
    report = None
    for step in STEPS[STEPS.index(from_step) :]:
        report = STEP_FUNCTIONS[step](day=day)
    assert isinstance(report, DailySalesReport)  # the last step, publish, returns it
    return report
