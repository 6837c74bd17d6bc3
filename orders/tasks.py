"""Celery tasks of the orders app: thin, idempotent, driven by rows in the database."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError

from core.due import retry_eta

from . import services


@shared_task(bind=True, name="orders.expire_reservations", max_retries=3)
def expire_reservations(self) -> int:
    """Expire the `awaiting_decision` orders that are due (beat runs this periodically)."""
    try:
        return services.orders_expire_due(limit=settings.ORDER_EXPIRY_BATCH)
    except OperationalError as exc:
        # A lost connection or a failover: transient. Anything else is a bug
        # and the next beat tick tries again anyway.
        raise self.retry(exc=exc, eta=retry_eta(self.request.retries)) from exc


@shared_task(bind=True, name="orders.compensation_step", max_retries=3, acks_late=True)
def compensation_step(self, step_id: int) -> str:
    """Make one attempt at a compensation step row, if it is due (idempotent: acks late).

    The row decides (core.due.attempt_begin): a redelivered message, the
    bell and the sweeper's ring make at most one attempt between them.
    """
    from . import compensation

    try:
        return compensation.step_run(step_id=step_id)
    except (OperationalError, InterfaceError) as exc:
        raise self.retry(exc=exc, eta=retry_eta(self.request.retries)) from exc


@shared_task(bind=True, name="orders.sweep_compensation", max_retries=0)
def sweep_compensation(self) -> int:
    """Enqueue every due compensation step (beat, every COMPENSATION_SWEEP_INTERVAL seconds)."""
    from . import compensation

    return compensation.steps_sweep(limit=settings.COMPENSATION_SWEEP_BATCH)
