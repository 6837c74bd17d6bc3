"""`manage.py sales_report --date YYYY-MM-DD` (or `--from/--to`): run the daily sales report."""

from __future__ import annotations

import sys
import time
from datetime import date, timedelta

from django.core.management.base import BaseCommand, CommandError

from reports import pipeline
from reports.models import DailySalesReport


def _day(value: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise CommandError(f"{value!r} is not a date (YYYY-MM-DD).") from None


class Command(BaseCommand):
    help = (
        "Run the daily sales report (extract → aggregate → publish) in this process for one "
        "closed day or a range of closed days, in the shop's time zone. Safe to re-run: each "
        "step rewrites its own output, and the same figures publish nothing new."
    )

    def add_arguments(self, parser):
        parser.add_argument("--date", help="one day, YYYY-MM-DD")
        parser.add_argument("--from", dest="start", help="first day of a range, YYYY-MM-DD")
        parser.add_argument("--to", dest="end", help="last day of a range (inclusive)")
        parser.add_argument(
            "--from-step",
            choices=pipeline.STEPS,
            default="extract",
            help="re-run from this step on (after a crash in it)",
        )

    def handle(self, *args, date=None, start=None, end=None, from_step="extract", **options):
        if date and (start or end):
            raise CommandError("Give --date, or --from and --to, not both.")
        if date:
            first = last = _day(date)
        elif start and end:
            first, last = _day(start), _day(end)
        else:
            raise CommandError("Give --date YYYY-MM-DD, or --from and --to.")
        if last < first:
            raise CommandError("--to is before --from.")
        days = [first + timedelta(days=n) for n in range((last - first).days + 1)]
        try:
            pipeline.check_closed(days[-1])
        except pipeline.ReportDayNotClosed as exc:
            raise CommandError(exc.detail) from None

        steps = pipeline.STEPS[pipeline.STEPS.index(from_step) :]
        total = len(days) * len(steps)
        done = 0
        started = time.monotonic()
        for day in days:
            report = None
            for step in steps:
                self._progress(done, total, f"{day} {step}")
                report = pipeline.STEP_FUNCTIONS[step](day=day)
                done += 1
            self._progress(done, total, f"{day} published", end="\n")
            assert isinstance(report, DailySalesReport)  # the last step, publish, returns it
            self.stdout.write(
                f"{day} revision {report.revision} orders {report.orders} units {report.units} "
                f"revenue {report.revenue} {report.currency} hash {report.content_hash}"
            )
        self.stdout.write(f"{len(days)} day(s) in {time.monotonic() - started:.1f} s")

    @staticmethod
    def _progress(done: int, total: int, label: str, *, end: str = "") -> None:
        width = 30
        filled = width * done // total
        bar = "#" * filled + "-" * (width - filled)
        sys.stderr.write(f"\r[{bar}] {done}/{total} {label:<28}{end}")
        sys.stderr.flush()
