"""The one backoff of due work and its Celery countdowns, timed by the database clock."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from django.conf import settings

from core.db import database_now_estimate

# A task's own Celery retries (the database blinking) wait at most this long
# before the cap below; longer waits are the row's `next_attempt_at`.
RETRY_BACKOFF_CAP = 10.0


def backoff(attempt: int, *, base: float, cap: float) -> float:
    """Return seconds to wait after attempt `attempt` (1-based): exponential, capped, jittered.

    `min(base * 2**(attempt - 1), cap)` with equal jitter: half of it fixed,
    half random, so runners that failed together do not return together.
    """
    ceiling = min(base * 2.0 ** min(max(attempt - 1, 0), 64), cap)
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def max_countdown() -> float:
    """Return the largest Celery countdown any task may use.

    On Redis a message is unacked from its delivery (countdown included)
    until its task ends; past the visibility timeout Redis hands it to a
    second worker. So countdown + the hard time limit stays below the
    visibility timeout, whatever the settings say about CELERY_MAX_COUNTDOWN.
    RabbitMQ has no visibility timeout; the same window
    (CELERY_VISIBILITY_TIMEOUT) bounds it there, so both brokers cap alike.
    """
    visibility = float(
        settings.CELERY_BROKER_TRANSPORT_OPTIONS.get(
            "visibility_timeout", settings.CELERY_VISIBILITY_TIMEOUT
        )
    )
    by_limits = visibility - float(settings.CELERY_TASK_TIME_LIMIT) - 1
    return max(0.0, min(float(settings.CELERY_MAX_COUNTDOWN), by_limits))


def countdown(delay: float) -> float:
    """Return a Celery countdown for `delay` seconds, clamped to [0, max_countdown()]."""
    return max(0.0, min(float(delay), max_countdown()))


def retry_countdown(retries: int) -> float:
    """Return the countdown of a task's Celery retry number `retries + 1` (self.request.retries)."""
    return countdown(backoff(retries + 1, base=1.0, cap=RETRY_BACKOFF_CAP))


def retry_eta(retries: int) -> datetime:
    """Return the ETA of a task's Celery retry number `retries + 1`, by the database clock.

    `self.retry(countdown=…)` would become an ETA on this host's clock, which
    the worker that receives it judges by its own: the others would hold the
    retries of a host ahead by as much as it is ahead (as they would its rings
    for later, `ring`). The retry follows a lost connection, so the clock is
    not asked again: `database_now_estimate` (this process's offset from the
    database clock, as last read).
    """
    return database_now_estimate() + timedelta(seconds=retry_countdown(retries))
