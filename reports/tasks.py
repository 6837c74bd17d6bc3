"""Celery tasks of the daily sales report: a chain extract → aggregate → publish per day.

Each task takes the day (ISO date), calls one pipeline step and returns;
a redelivered or retried task re-runs its step, which rewrites its own
output for the day (reports.pipeline). Beat starts the chain every night
for the day before (`reports.daily_sales_previous_day`).
"""

from __future__ import annotations

import logging
import random
from datetime import date

from celery import chain, shared_task
from django.conf import settings
from django.db import OperationalError

from . import pipeline

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


@shared_task(bind=True, name="reports.daily_sales_previous_day")
def daily_sales_previous_day(self) -> str:
    """Start the chain for yesterday in the shop's time zone (beat, every night)."""
    day = pipeline.last_closed_day()
    daily_sales_chain(day).apply_async()
    logger.info("daily sales report for %s started", day)
    return day.isoformat()
