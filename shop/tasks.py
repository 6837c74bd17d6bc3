"""The consumer tasks: one per consumer, rung by the relay with a batch of outbox message ids.

The relay publishes one message per consumer per batch, carrying a list of
outbox message ids; the task hands them to
`idempotency.messaging.deliveries.deliveries_consume` (claimed `FOR UPDATE SKIP
LOCKED` in pk order, attempts counted first, every effect and every delivery's
`done_at` in one transaction, one by one after any failure so that a poison
message is a dead letter alone). A single id (text, as published before the
batches, or by hand) takes the one-delivery path, `delivery_consume`. The
e-mails consumer is batched the same way: it writes mail rows, and
`shop.send_mail` sends them later (due work; `shop.sweep_mail` re-rings).

`acks_late` + `reject_on_worker_lost`: a worker killed mid-task gets the
message back; the rows' attempt counts bound a message that keeps killing
workers (a row tried before runs alone). No Celery retries: a failed attempt
is due again on its row and the delivery sweeper publishes it after the backoff.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError

from core.api_tokens import api_tokens_purge
from core.due import retry_eta
from idempotency.messaging.deliveries import deliveries_consume, delivery_consume

from . import emails, history, loyalty

LOYALTY = "loyalty"
HISTORY = history.CONSUMER  # "purchase_history": the inbox's consumer name too

_OPTIONS: dict[str, Any] = {
    "bind": True,
    "acks_late": True,
    "reject_on_worker_lost": True,
    "max_retries": 0,
}


def _loyalty(*, message_id: str, event_type: str, payload: dict):
    return loyalty.loyalty_apply(event_id=message_id, event_type=event_type, payload=payload)


def _consume(
    consumer: str, message_ids: str | list[str], *, apply, apply_many, atomic: bool
) -> str:
    if isinstance(message_ids, str):
        result, outcome = delivery_consume(
            consumer=consumer, message_id=message_ids, apply=apply, atomic=atomic
        )
        return f"{result}:{getattr(outcome, 'outcome', '')}"
    if not isinstance(message_ids, list):
        return "skipped:"
    return deliveries_consume(
        consumer=consumer,
        message_ids=[str(m) for m in message_ids],
        apply_many=apply_many,
        apply=apply,
        atomic=atomic,
    ).summary()


@shared_task(name="shop.consume_loyalty", **_OPTIONS)
def consume_loyalty(self, message_ids: str | list[str]) -> str:
    """Apply outbox messages to loyalty points (a batch in one transaction; one id: its own)."""
    # Module attributes read at call time (tests replace them).
    return _consume(
        LOYALTY,
        message_ids,
        apply=_loyalty,
        apply_many=loyalty.loyalty_apply_many,
        atomic=False,
    )


@shared_task(name="shop.consume_history", **_OPTIONS)
def consume_history(self, message_ids: str | list[str]) -> str:
    """Apply outbox messages to the purchase history (inbox claims, same transaction)."""
    return _consume(
        HISTORY,
        message_ids,
        apply=history.history_apply,
        apply_many=history.history_apply_many,
        atomic=True,
    )


@shared_task(name="shop.consume_emails", **_OPTIONS)
def consume_emails(self, message_ids: str | list[str]) -> str:
    """Write the shopper mails of a ring (a batch in one transaction; one id: its own)."""
    return _consume(
        emails.CONSUMER,
        message_ids,
        apply=emails.email_apply,
        apply_many=emails.email_apply_many,
        atomic=True,
    )


MAIL_TASK_RETRIES = 3


@shared_task(name=emails.SEND_TASK, bind=True, max_retries=MAIL_TASK_RETRIES, acks_late=True)
def send_mail(self, mail_ids: int | list[int]) -> str:
    """Send the due mail rows named (one id from the sweeper or staff, a list from the bell).

    The rows decide (core.due.attempt_begin): a redelivered message, the bell
    and the sweeper's ring make at most one attempt per row between them.
    Celery retries only the database blinking; a failed send is the row's.
    """
    ids = [mail_ids] if isinstance(mail_ids, int) else [int(m) for m in mail_ids]
    try:
        return emails.mails_send(mail_ids=ids).summary()
    except (OperationalError, InterfaceError) as exc:
        raise self.retry(exc=exc, eta=retry_eta(self.request.retries)) from exc


@shared_task(name="shop.sweep_mail", bind=True, max_retries=0)
def sweep_mail(self) -> int:
    """Ring for every due mail row (run by beat every SHOP_MAIL_SWEEP_INTERVAL seconds)."""
    return len(emails.mails_sweep(limit=settings.SHOP_MAIL_SWEEP_BATCH))


@shared_task(name="shop.purge_mail", bind=True, max_retries=0)
def purge_mail(self) -> int:
    """Delete sent mails past SHOP_MAIL_RETENTION (beat, every SHOP_MAIL_PURGE_EVERY seconds)."""
    return emails.mails_purge()


@shared_task(name="shop.purge_api_tokens", bind=True, max_retries=0)
def purge_api_tokens(self) -> int:
    """Delete API token rows past API_TOKEN_LIFETIME (beat, every API_TOKEN_PURGE_EVERY seconds)."""
    return api_tokens_purge()
