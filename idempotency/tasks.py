"""Periodic tasks of the request-key machinery (scheduled by beat, see settings)."""

from celery import shared_task

from . import keys


@shared_task(bind=True, name="idempotency.complete_abandoned_keys", max_retries=0)
def complete_abandoned_keys(self) -> int:
    """Finish or roll back keys abandoned mid-way (the next beat tick is the retry)."""
    return keys.keys_complete_abandoned()


@shared_task(bind=True, name="idempotency.purge_finished_keys", max_retries=0)
def purge_finished_keys(self) -> int:
    """Delete finished keys past their retention, in bounded batches."""
    return keys.keys_purge()
