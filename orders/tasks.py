"""Celery tasks of the orders app: thin, idempotent, driven by rows in the database."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings
from django.db import OperationalError

from core.due import retry_countdown

from . import services


@shared_task(bind=True, name="orders.expire_reservations", max_retries=3)
def expire_reservations(self) -> int:
    """Expire the `awaiting_decision` orders that are due (beat runs this periodically)."""
    try:
        return services.orders_expire_due(limit=settings.ORDER_EXPIRY_BATCH)
    except OperationalError as exc:
        # A lost connection or a failover: transient. Anything else is a bug
        # and the next beat tick tries again anyway.
        raise self.retry(exc=exc, countdown=retry_countdown(self.request.retries)) from exc
