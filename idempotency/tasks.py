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


@shared_task(bind=True, name="idempotency.relay_outbox", max_retries=0)
def relay_outbox(self) -> int:
    """Beat's fallback relay: publish due outbox rows for a bounded time (the process is first)."""
    from django.conf import settings

    from .messaging import relay

    return relay.relay_for(settings.CELERY_TASK_SOFT_TIME_LIMIT / 2)


@shared_task(bind=True, name="idempotency.sweep_deliveries", max_retries=0)
def sweep_deliveries(self) -> int:
    """Publish again the deliveries whose consumer has not marked them done in time."""
    from .messaging import relay

    return relay.deliveries_sweep()


@shared_task(bind=True, name="idempotency.purge_inbox", max_retries=0)
def purge_inbox(self) -> int:
    """Delete inbox rows past IDEMPOTENCY_INBOX_RETENTION (unmatched provider events kept)."""
    from .messaging import inbox

    return inbox.inbox_purge()


@shared_task(bind=True, name="idempotency.purge_outbox", max_retries=0)
def purge_outbox(self) -> int:
    """Delete published messages past OUTBOX_RETENTION (all deliveries done), in bounded batches."""
    from .messaging import relay

    return relay.outbox_purge()
