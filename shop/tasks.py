"""The consumer tasks: one per consumer, published by the relay with the outbox message id.

Each task re-reads the message and hands it to its consumer through
`idempotency.deliveries.delivery_consume` (attempt counted in the delivery
row first, effect once, delivery marked done, poison and spent budgets made
dead letters). `acks_late` + `reject_on_worker_lost`: a worker killed
mid-task gets the message back; the row's attempt count bounds a message
that keeps killing workers. No Celery retries: a failed attempt is due again
on its row and the delivery sweeper publishes it after the backoff.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from idempotency.deliveries import delivery_consume

from . import history, loyalty

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


@shared_task(name="shop.consume_loyalty", **_OPTIONS)
def consume_loyalty(self, message_id: str) -> str:
    """Apply one outbox message to loyalty points (own transactions, so outside one here)."""
    result, outcome = delivery_consume(
        consumer=LOYALTY, message_id=message_id, apply=_loyalty, atomic=False
    )
    return f"{result}:{getattr(outcome, 'outcome', '')}"


@shared_task(name="shop.consume_history", **_OPTIONS)
def consume_history(self, message_id: str) -> str:
    """Apply one outbox message to the purchase history (inbox claim, same transaction)."""
    result, outcome = delivery_consume(
        consumer=HISTORY, message_id=message_id, apply=history.history_apply, atomic=True
    )
    return f"{result}:{getattr(outcome, 'outcome', '')}"
