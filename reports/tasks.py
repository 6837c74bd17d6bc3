"""Celery tasks of the daily sales report: the run, and a chain extract → aggregate → publish.

Beat's run (`reports.make_days`) makes every closed day not yet published,
oldest first (reports.days; docs/reports.md, "Every closed day, once
(catch-up)"). The chain makes one day on the workers step by step: each
task takes the day (ISO date), calls one pipeline step and returns; a
redelivered or retried task re-runs its step, which rewrites its own output
for the day (reports.pipeline).
"""

from __future__ import annotations

import logging
import random
from datetime import date

from celery import chain, shared_task
from django.conf import settings
from django.db import OperationalError

from . import days, pipeline

logger = logging.getLogger(__name__)


def _backoff(retries: int) -> float:
    return min(settings.CELERY_MAX_COUNTDOWN, 2**retries + random.uniform(0, 1))


def _step(task, step: str, day: str) -> str:
    try:
        pipeline.STEP_FUNCTIONS[step](day=date.fromisoformat(day))
    except OperationalError as exc:
        # A lost connection or a failover is transient; a refusal (day not closed) is not.
        raise task.retry(exc=exc, countdown=_backoff(task.request.retries)) from exc
    return day


@shared_task(bind=True, name="reports.extract", max_retries=3)
def extract(self, day: str) -> str:
    """Rewrite the day's extract rows."""
    return _step(self, "extract", day)


@shared_task(bind=True, name="reports.aggregate", max_retries=3)
def aggregate(self, day: str) -> str:
    """Rewrite the day's figures from its extract rows."""
    return _step(self, "aggregate", day)


@shared_task(bind=True, name="reports.publish", max_retries=3)
def publish(self, day: str) -> str:
    """Publish the day's figures (a new revision only if they changed)."""
    return _step(self, "publish", day)


STEP_TASKS = {"extract": extract, "aggregate": aggregate, "publish": publish}


def daily_sales_chain(day: date, *, from_step: str = "extract"):
    """Return the chain of the day's steps from `from_step` on (immutable signatures)."""
    steps = pipeline.STEPS[pipeline.STEPS.index(from_step) :]
    return chain(*(STEP_TASKS[step].si(day.isoformat()) for step in steps))


@shared_task(bind=True, name="reports.make_days", max_retries=0)
def make_days(self, day_id: int | None = None) -> list[str]:
    """Make every closed day not yet published, oldest first (beat; a staff retry rings it
    with the day's row id, which the run makes among the others)."""
    made = days.days_make()
    if made:
        logger.info("sales reports made: %s", ", ".join(d.isoformat() for d in made))
    return [d.isoformat() for d in made]
