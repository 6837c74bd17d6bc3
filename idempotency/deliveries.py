"""The consumer side of a delivery: count the attempt, apply, mark done; or dead-letter.

A consumer task calls `delivery_consume(consumer=..., message_id=..., apply=...)`
with the outbox message id it was published with. The row is re-read here
(ids travel, never payloads):

1. the attempt is counted in the database **before** the consumer runs (one
   committed UPDATE), so a redelivery after a worker loss, whose Celery retry
   count starts again at 0, still spends the budget; past the budget the
   delivery becomes a dead letter instead of running again;
2. `apply(event_type=..., payload=..., message_id=...)` makes the effect once
   (inbox claim or loyalty's applied ids: a copy is acknowledged with no
   effect, counted by the consumer). With `atomic=True` the delivery is
   marked done in the same transaction as the effect; otherwise right after
   (loyalty runs its own transactions; a crash in between leaves the delivery
   due and the next copy is a counted duplicate);
3. an exception whose `retryable` is False (`shop.events.PoisonMessage`) is a
   dead letter at once with the reason; any other records the error and the
   delivery is due again after the backoff (`core.due`), until the budget.

A delivery already done still runs `apply`: the consumer's own record then
refuses the copy and counts it (the duplicate counters show every copy). A
dead letter is not run until staff requeue it.

    dead_letters_count()   deliveries that are dead letters (the `shop_dead_letters` gauge)
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable
from typing import Any

from django.db import connection, transaction

from core import due

from .models import Delivery, OutboxMessage

logger = logging.getLogger(__name__)


class Result(enum.StrEnum):
    APPLIED = "applied"  # apply returned (applied, duplicate or ignored: the consumer's word)
    DEAD_LETTER = "dead_letter"  # this run made it a dead letter
    FAILED = "failed"  # retryable failure recorded; due again after the backoff
    SKIPPED = "skipped"  # a dead letter already, or no such message / delivery


def _attempt_count(pk: int, *, seen: int) -> int | None:
    """Count one attempt of a pending delivery and push it back by the backoff; None if done.

    `attempts = attempts + 1` in the database: two copies running at once
    count two attempts (`seen`, the count read before, only sizes the backoff).
    """
    delay = Delivery.due_policy().backoff(seen + 1)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE idempotency_delivery SET attempts = attempts + 1,"
            " next_attempt_at = now() + make_interval(secs => %s), updated_at = now()"
            " WHERE id = %s AND done_at IS NULL AND NOT needs_attention RETURNING attempts",
            [delay, pk],
        )
        row = cursor.fetchone()
    return None if row is None else row[0]


def delivery_consume(
    *, consumer: str, message_id: str, apply: Callable[..., Any], atomic: bool
) -> tuple[Result, Any]:
    """Run consumer `consumer` on outbox message `message_id` once more; see the module doc."""
    message = (
        OutboxMessage.objects.filter(pk=message_id).values("event_type", "payload").first()
        if _is_uuid(message_id)
        else None
    )
    delivery = (
        # A UUID's text is a valid lookup (checked above); the stubs want a UUID.
        Delivery.objects.filter(consumer=consumer, message_id=message_id)  # type: ignore[misc]
        .values("pk", "done_at", "needs_attention", "attempts")
        .first()
        if message is not None
        else None
    )
    if message is None or delivery is None:
        # Purged (long done) or never written: nothing to apply; acknowledge.
        logger.warning("%s: no delivery for message %r; acknowledged", consumer, message_id)
        return Result.SKIPPED, None
    pk = delivery["pk"]
    done = delivery["done_at"] is not None
    if not done:
        if delivery["needs_attention"]:
            return Result.SKIPPED, None
        budget = Delivery.due_policy().max_attempts
        if delivery["attempts"] >= budget:
            due.flag_attention(Delivery, pk=pk, reason=f"attempt budget spent ({budget} attempts)")
            return Result.DEAD_LETTER, None
        if _attempt_count(pk, seen=delivery["attempts"]) is None:
            # Done or dead-lettered by a concurrent copy since the read.
            done = Delivery.objects.filter(pk=pk, done_at__isnull=False).exists()
            if not done:
                return Result.SKIPPED, None
    kwargs = {
        "message_id": str(message_id),
        "event_type": message["event_type"],
        "payload": message["payload"],
    }
    try:
        if atomic:
            with transaction.atomic():
                outcome = apply(**kwargs)
                due.mark_done(Delivery, pk=pk)
        else:
            outcome = apply(**kwargs)
            due.mark_done(Delivery, pk=pk)
    except Exception as exc:  # noqa: BLE001 - every failure ends in a row, never a crash
        if getattr(exc, "retryable", True) is False:
            due.flag_attention(Delivery, pk=pk, reason=f"{type(exc).__name__} (not retried): {exc}")
            logger.warning("%s: message %s is a dead letter: %s", consumer, message_id, exc)
            return Result.DEAD_LETTER, exc
        spent = due.attempt_failed(
            Delivery,
            pk=pk,
            error=f"{type(exc).__name__}: {exc}",
        )
        logger.warning("%s: message %s failed (%s): %s", consumer, message_id, spent, exc)
        return (Result.DEAD_LETTER if spent else Result.FAILED), exc
    return Result.APPLIED, outcome


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


def dead_letters_count() -> int:
    """Return the number of dead letters (deliveries needing attention): `shop_dead_letters`."""
    return Delivery.objects.filter(needs_attention=True, done_at__isnull=True).count()


def dead_letter_requeue(pk: int) -> bool:
    """Staff: give a dead letter a fresh budget, due now, and publish it after commit."""
    from . import relay

    reopened = due.retry_now(Delivery, pk=pk)
    if reopened:
        transaction.on_commit(lambda: relay.deliveries_ring([pk]))
    return reopened
