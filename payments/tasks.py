"""Celery tasks of the payments app: thin wrappers that pass ids to services.

The rows are the ledger: the sweeper finds due settlements in the database,
so a lost message, a Redis restart or a killed worker loses no work. Celery
retries are only for the database blinking, with countdowns capped at
`CELERY_MAX_COUNTDOWN`; the provider's unknown answers are retried by the
settlement row's own schedule, never by a Celery countdown.
"""

from __future__ import annotations

import random

from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError

from . import services

MAX_TASK_RETRIES = 3


def _retry_countdown(retries: int) -> float:
    return services.settle_countdown(min(2**retries, 10) * random.uniform(0.5, 1.0))


@shared_task(bind=True, name="payments.settle_payment", max_retries=MAX_TASK_RETRIES)
def settle_payment(self, settlement_id: int) -> None:
    """Make one settlement attempt for a settlement row, if it is due."""
    try:
        services.payment_settle(settlement_id=settlement_id)
    except (OperationalError, InterfaceError) as exc:
        raise self.retry(exc=exc, countdown=_retry_countdown(self.request.retries)) from exc


@shared_task(bind=True, name="payments.sweep_settlements", max_retries=0)
def sweep_settlements(self) -> int:
    """Enqueue every due settlement (run by beat every PAYMENTS_SWEEP_INTERVAL seconds)."""
    ids = services.settlements_claim_due(limit=settings.PAYMENTS_SWEEP_BATCH)
    for settlement_id in ids:
        settle_payment.delay(settlement_id)
    return len(ids)
