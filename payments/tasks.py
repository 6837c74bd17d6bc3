"""Celery tasks of the payments app: thin wrappers that pass ids to services.

The rows are the ledger: the sweeper finds due settlements in the database
(`core.due`), so a lost message, a Redis restart or a killed worker loses no
work. Celery retries are only for the database blinking, with
`core.due.retry_eta` (by the database clock, capped below the visibility timeout); the
provider's unknown answers are retried by the settlement row's own schedule,
never by a Celery countdown. The services never import this module: they
ring the bell by the task's name (`PaymentSettlement.due_policy().task`).
"""

from __future__ import annotations

from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError

from core import due
from core.due import retry_eta

from .models import PaymentSettlement, Refund
from .refunds import refund_run
from .settlement import payment_settle

MAX_TASK_RETRIES = 3


@shared_task(bind=True, name="payments.settle_payment", max_retries=MAX_TASK_RETRIES)
def settle_payment(self, settlement_id: int) -> None:
    """Make one settlement attempt for a settlement row, if it is due."""
    try:
        payment_settle(settlement_id=settlement_id)
    except (OperationalError, InterfaceError) as exc:
        raise self.retry(exc=exc, eta=retry_eta(self.request.retries)) from exc


@shared_task(bind=True, name="payments.sweep_settlements", max_retries=0)
def sweep_settlements(self) -> int:
    """Enqueue every due settlement (run by beat every PAYMENTS_SWEEP_INTERVAL seconds)."""
    return len(due.sweep(PaymentSettlement, limit=settings.PAYMENTS_SWEEP_BATCH))


@shared_task(bind=True, name="payments.refund", max_retries=MAX_TASK_RETRIES, acks_late=True)
def refund(self, refund_id: str) -> None:
    """Make one attempt at a refund row, if it is due (idempotent: acks late).

    The row decides (core.due.attempt_begin): a redelivered message, the
    bell and the sweeper's ring make at most one attempt between them.
    """
    try:
        refund_run(refund_id=refund_id)
    except (OperationalError, InterfaceError) as exc:
        raise self.retry(exc=exc, eta=retry_eta(self.request.retries)) from exc


@shared_task(bind=True, name="payments.sweep_refunds", max_retries=0)
def sweep_refunds(self) -> int:
    """Enqueue every due refund (run by beat every PAYMENTS_SWEEP_INTERVAL seconds)."""
    return len(due.sweep(Refund, limit=settings.PAYMENTS_SWEEP_BATCH))
