"""Celery tasks of the orders app: thin, idempotent, driven by rows in the database."""

from __future__ import annotations

import random

from celery import shared_task
from django.conf import settings
from django.db import OperationalError

from . import services


def _backoff(retries: int) -> float:
    """Return an exponential delay with jitter, never above CELERY_MAX_COUNTDOWN."""
    return min(settings.CELERY_MAX_COUNTDOWN, 2**retries + random.uniform(0, 1))


@shared_task(bind=True, name="orders.expire_reservations", max_retries=3)
def expire_reservations(self) -> int:
    """Expire the `awaiting_decision` orders that are due (beat runs this periodically)."""
    try:
        return services.orders_expire_due(limit=settings.ORDER_EXPIRY_BATCH)
    except OperationalError as exc:
        # A lost connection or a failover: transient. Anything else is a bug
        # and the next beat tick tries again anyway.
        raise self.retry(exc=exc, countdown=_backoff(self.request.retries)) from exc
