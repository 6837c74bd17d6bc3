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

**Batches** (`deliveries_consume`, what the relay rings for; docs/events.md,
"Batched consumers"): one task message carries many message ids of one
consumer.

1. **claim** (one committed transaction): the ring's own delivery rows and,
   up to the consumer's batch in all, the oldest other *fresh* rows of its
   consumer (never tried, due), `FOR UPDATE SKIP LOCKED` in pk order (rows
   another claim holds right now are left to it): under load the rings
   coalesce, the first to run takes what is due and the later ones find
   their rows done. Fresh rows (no attempt yet) get their attempt counted in
   one UPDATE; rows tried before (a failed or killed run: *suspects*) are set
   aside; spent budgets become dead letters. A row taken **ahead** of its own
   ring keeps that ring's lease when it is marked done; the ring that then
   names it ends the lease and is acknowledged (`Result.TAKEN`), not handed
   to the consumer as a copy;
2. **apply** (one transaction): the fresh rows (and copies of done ones) are
   locked again, `apply_many` makes every effect (inbox rows or applied ids
   with them), and one UPDATE marks them all done;
3. **on any exception** in 2 the transaction rolls back whole and the batch
   is applied **one by one**, each row in its own transaction without counting
   its attempt again: only the failing row records its error (or becomes a
   dead letter); its neighbours are applied. Suspects always run one by one
   (`delivery_consume`, attempt counted first), so a message that kills the
   worker spends its own budget alone and never its neighbours'.

**Per message** (`apply_many=None`, for a consumer whose effect cannot be
undone; none is registered today: the e-mails consumer writes mail rows in a
batch and sends them later): step 1 as above, no step 2. Each claimed row
goes through `apply` in its own transaction (the consumer's inbox claim, its
effect, `done_at`, one commit), as in step 3: an effect is never undone by a
neighbour's rollback, and a failing or poison row records only its own error.

    dead_letters_count()   deliveries that are dead letters (the `shop_dead_letters` gauge)
"""

from __future__ import annotations

import enum
import json
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from core import due
from core.instruments import OUTBOX_LAG

from ..failpoints import failpoint
from ..models import Delivery, OutboxMessage

logger = logging.getLogger(__name__)


class Result(enum.StrEnum):
    APPLIED = "applied"  # apply returned (applied, duplicate or ignored: the consumer's word)
    DEAD_LETTER = "dead_letter"  # this run made it a dead letter
    FAILED = "failed"  # retryable failure recorded; due again after the backoff
    SKIPPED = "skipped"  # a dead letter already, or no such message / delivery
    TAKEN = "taken"  # applied ahead by another ring before this one, its own, arrived


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
    return _run_one(
        consumer=consumer,
        pk=pk,
        message_id=str(message_id),
        event_type=message["event_type"],
        payload=message["payload"],
        apply=apply,
        atomic=atomic,
    )


def _run_one(
    *,
    consumer: str,
    pk: int,
    message_id: str,
    event_type: str,
    payload: Any,
    apply: Callable[..., Any],
    atomic: bool,
    ahead: bool = False,
) -> tuple[Result, Any]:
    """Apply one delivery whose attempt is already counted; mark it done or record why not.

    `ahead`: the row was taken ahead of its own ring, whose lease it keeps when done.
    """
    kwargs = {"message_id": message_id, "event_type": event_type, "payload": payload}
    kept = [pk] if ahead else []
    try:
        if atomic:
            with transaction.atomic():
                outcome = apply(**kwargs)
                lags = _mark_done([pk], ahead=kept)
        else:
            outcome = apply(**kwargs)
            lags = _mark_done([pk], ahead=kept)
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
    _observe_lag(consumer, lags)
    return Result.APPLIED, outcome


# -- done, and how late ---------------------------------------------------------------

# Done in one statement for a whole batch; the lag (message created -> delivery done,
# both by the database clock) comes back for `shop_outbox_lag_seconds`. A row taken
# ahead of its own ring keeps that ring's lease: the ring still on its way ends it.
_MARK_DONE = (
    "UPDATE idempotency_delivery d SET done_at = now(), needs_attention = false,"
    " lease_owner = CASE WHEN d.id = ANY(%(ahead)s) THEN d.lease_owner ELSE '' END,"
    " lease_expires_at = CASE WHEN d.id = ANY(%(ahead)s) THEN d.lease_expires_at END,"
    " updated_at = now()"
    " FROM idempotency_outboxmessage m"
    " WHERE d.id = ANY(%(pks)s) AND d.done_at IS NULL AND m.id = d.message_id"
    " RETURNING EXTRACT(EPOCH FROM now() - m.created_at)::float"
)


def _mark_done(pks: Sequence[int], *, ahead: Sequence[int] = ()) -> list[float]:
    """Mark the deliveries `pks` done (those not done yet); return each one's lag in seconds.

    `ahead`: those of `pks` taken ahead of their own ring (they keep its lease).
    """
    if not pks:
        return []
    with connection.cursor() as cursor:
        cursor.execute(_MARK_DONE, {"pks": list(pks), "ahead": list(ahead)})
        return [max(0.0, float(row[0])) for row in cursor.fetchall()]


def _observe_lag(consumer: str, lags: Iterable[float]) -> None:
    # Called after the commit that made the effects stand (a rolled-back batch is not counted).
    histogram = OUTBOX_LAG.labels(consumer=consumer)
    for lag in lags:
        histogram.observe(lag)


# -- batches ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """One outbox message as a batch consumer sees it (re-read from the row, never the wire)."""

    message_id: str
    event_type: str
    payload: Any
    aggregate_type: str
    aggregate_id: str
    created_at: datetime
    copy: bool = False  # its delivery is done already: a redelivered copy (apply refuses it)


@dataclass
class BatchResult:
    """What one batch came to, by delivery (message id -> Result)."""

    results: dict[str, Result]
    outcomes: dict[str, Any]
    one_by_one: bool = False  # the batch transaction failed and rows were applied singly

    def summary(self) -> str:
        counts = Counter(str(r) for r in self.results.values())
        return ",".join(f"{name}:{n}" for name, n in sorted(counts.items()))


# The ring's own rows, then (`room`: the batch less the ring's ids) the oldest fresh
# rows of its consumer (never tried, due; `idempotency_delivery_fresh_idx`), each
# `FOR UPDATE SKIP LOCKED`; the columns as locked (a row changed since the statement
# began is read as it is now). The last column: the row is one of the ring's own.
_CLAIM_COLUMNS = "d.id, d.message_id, d.attempts, d.done_at, d.needs_attention, d.lease_owner"
_CLAIM = (
    f"WITH own AS MATERIALIZED (SELECT {_CLAIM_COLUMNS} FROM idempotency_delivery d"
    "  WHERE d.consumer = %(consumer)s AND d.message_id = ANY(%(ids)s::uuid[])"
    "  ORDER BY d.id FOR UPDATE SKIP LOCKED),"
    f" ahead AS MATERIALIZED (SELECT {_CLAIM_COLUMNS} FROM idempotency_delivery d"
    "  WHERE d.consumer = %(consumer)s AND d.attempts = 0 AND d.done_at IS NULL"
    "   AND NOT d.needs_attention AND d.next_attempt_at <= now()"
    "   AND d.id NOT IN (SELECT id FROM own)"
    "  ORDER BY d.id LIMIT %(room)s FOR UPDATE SKIP LOCKED),"
    " claimed AS (SELECT *, true AS mine FROM own UNION ALL SELECT *, false FROM ahead)"
    " SELECT id, message_id::text, attempts, done_at IS NOT NULL, needs_attention,"
    "  lease_owner <> '', mine FROM claimed ORDER BY id"
)
# The ring arrived for rows taken ahead of it: their lease (its own) ends.
_END_LEASE = (
    "UPDATE idempotency_delivery SET lease_owner = '', lease_expires_at = NULL,"
    " updated_at = now() WHERE id = ANY(%s) AND done_at IS NOT NULL"
)
_COUNT_FRESH = (
    "UPDATE idempotency_delivery SET attempts = attempts + 1,"
    " next_attempt_at = now() + make_interval(secs => %s), updated_at = now()"
    " WHERE id = ANY(%s) AND attempts = 0 AND done_at IS NULL AND NOT needs_attention"
    " RETURNING id"
)
_LOCK_AND_READ = (
    "SELECT d.id, d.message_id::text, d.done_at IS NOT NULL, m.event_type, m.payload,"
    " m.aggregate_type, m.aggregate_id, m.created_at"
    " FROM idempotency_delivery d JOIN idempotency_outboxmessage m ON m.id = d.message_id"
    " WHERE d.id = ANY(%s) AND NOT d.needs_attention"
    " ORDER BY d.id FOR UPDATE OF d SKIP LOCKED"
)


def _json(value: Any) -> Any:
    # A jsonb column read by a raw cursor comes back as text.
    return json.loads(value) if isinstance(value, str | bytes) else value


@dataclass
class _Claim:
    fresh: list[int]  # attempt counted now: applied together
    copies: list[int]  # done already: handed to the consumer to refuse (and count)
    suspects: list[tuple[int, str]]  # tried before and not done: one by one
    skipped: dict[str, Result]  # dead letters, spent budgets, rows held by another copy
    ahead: set[int]  # not the ring's own: taken ahead of their ring (fresh ones only)


def _claim(consumer: str, message_ids: list[str], *, room: int) -> tuple[_Claim, dict[int, str]]:
    """Lock the ring's deliveries and up to `room` other fresh ones of its consumer (skip
    those another claim holds), count fresh attempts."""
    budget = Delivery.due_policy().max_attempts
    claim = _Claim(fresh=[], copies=[], suspects=[], skipped={}, ahead=set())
    ids: dict[int, str] = {}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_CLAIM, {"consumer": consumer, "ids": message_ids, "room": max(0, room)})
        rows = cursor.fetchall()
        maybe_fresh = []
        arrived = []
        for pk, message_id, attempts, done, attention, leased, mine in rows:
            ids[pk] = message_id
            if not mine:
                claim.ahead.add(pk)
            if done and leased:
                # Taken ahead of this ring, which is its own: acknowledged, not a copy.
                arrived.append(pk)
                claim.skipped[message_id] = Result.TAKEN
            elif done:
                claim.copies.append(pk)
            elif attention:
                claim.skipped[message_id] = Result.SKIPPED
            elif attempts >= budget:
                due.flag_attention(
                    Delivery, pk=pk, reason=f"attempt budget spent ({budget} attempts)"
                )
                claim.skipped[message_id] = Result.DEAD_LETTER
            elif attempts == 0:
                maybe_fresh.append(pk)
            else:
                claim.suspects.append((pk, message_id))
        if maybe_fresh:
            # One backoff for the batch: it matters only if the whole batch dies (then every
            # row is a suspect on the next run, and runs alone).
            cursor.execute(_COUNT_FRESH, [Delivery.due_policy().backoff(1), maybe_fresh])
            claim.fresh = sorted(row[0] for row in cursor.fetchall())
        if arrived:
            cursor.execute(_END_LEASE, [arrived])
        failpoint("delivery.claimed")  # the batch's rows still locked by this claim
    claimed = {ids[pk] for pk in ids}
    for message_id in message_ids:
        if message_id not in claimed:
            # Held by a concurrent copy (SKIP LOCKED), or no delivery of this consumer.
            claim.skipped.setdefault(message_id, Result.SKIPPED)
    return claim, ids


def _read_locked(pks: list[int]) -> list[tuple[int, Message]]:
    with connection.cursor() as cursor:
        cursor.execute(_LOCK_AND_READ, [pks])
        rows = cursor.fetchall()
    return [
        (
            pk,
            Message(
                message_id=message_id,
                event_type=event_type,
                payload=_json(payload),
                aggregate_type=agg_type,
                aggregate_id=agg_id,
                created_at=created_at,
                copy=done,
            ),
        )
        for pk, message_id, done, event_type, payload, agg_type, agg_id, created_at in rows
    ]


def deliveries_consume(
    *,
    consumer: str,
    message_ids: Sequence[str],
    apply_many: Callable[[list[Message]], list[Any]] | None,
    apply: Callable[..., Any],
    atomic: bool,
    batch: int | None = None,
) -> BatchResult:
    """Apply consumer `consumer` to a batch of outbox messages; see the module doc.

    `batch`: the most rows one run claims, the ring's own ids included (default: the
    consumer's ring size, `relay.ring_size`); the room left goes to other due rows.

    `apply_many(messages)` runs inside the batch's transaction and returns one
    outcome per message, in order; it may raise (any exception sends the batch
    one by one through `apply`, the single-message consumer, with `atomic` as
    for `delivery_consume`). With `apply_many=None` there is no batch
    transaction: after the one claim, each row goes through `apply` in its
    own transaction (a consumer whose effect cannot be undone).
    """
    wanted = list(dict.fromkeys(str(m) for m in message_ids))
    result = BatchResult(results={}, outcomes={})
    valid = [m for m in wanted if _is_uuid(m)]
    for message_id in wanted:
        if message_id not in valid:
            logger.warning("%s: message id %r is no uuid; acknowledged", consumer, message_id)
            result.results[message_id] = Result.SKIPPED
    if not valid:
        return result
    if batch is None:
        from . import relay

        batch = relay.ring_size(consumer)
    claim, ids = _claim(consumer, valid, room=batch - len(valid))
    result.results.update(claim.skipped)
    together = sorted([*claim.fresh, *claim.copies])
    if together and apply_many is None:
        # No batch transaction: an effect that cannot be rolled back (a call out) must
        # commit with its own inbox claim, never wait on (or be undone with) a neighbour's.
        _one_by_one(
            consumer, together, ids, ahead=claim.ahead, apply=apply, atomic=atomic, into=result
        )
    elif together and apply_many is not None:
        try:
            with transaction.atomic():
                locked = _read_locked(together)
                messages = [message for _, message in locked]
                outcomes = apply_many(messages) if messages else []
                if len(outcomes) != len(messages):
                    raise RuntimeError(f"{consumer}: apply_many returned a wrong count")
                lags = _mark_done(
                    [pk for pk, message in locked if not message.copy],
                    ahead=[pk for pk, _ in locked if pk in claim.ahead],
                )
        except Exception as exc:  # noqa: BLE001 - the batch falls back to one by one
            logger.warning(
                "%s: batch of %d failed (%s: %s); applying one by one",
                consumer,
                len(together),
                type(exc).__name__,
                exc,
            )
            result.one_by_one = True
            _one_by_one(
                consumer, together, ids, ahead=claim.ahead, apply=apply, atomic=atomic, into=result
            )
        else:
            _observe_lag(consumer, lags)
            held = set(together) - {pk for pk, _ in locked}
            for pk in held:
                # Taken by a concurrent copy between our claim and our lock: left to it.
                result.results[ids[pk]] = Result.SKIPPED
            for (_, message), outcome in zip(locked, outcomes, strict=True):
                result.results[message.message_id] = Result.APPLIED
                result.outcomes[message.message_id] = outcome
    for _pk, message_id in claim.suspects:
        single, outcome = delivery_consume(
            consumer=consumer, message_id=message_id, apply=apply, atomic=atomic
        )
        result.results[message_id] = single
        result.outcomes[message_id] = outcome
    return result


def _one_by_one(
    consumer: str,
    pks: list[int],
    ids: dict[int, str],
    *,
    ahead: set[int],
    apply: Callable[..., Any],
    atomic: bool,
    into: BatchResult,
) -> None:
    """Apply each row alone (a failed batch, or a per-message consumer); attempt counted."""
    messages = {
        str(row["pk"]): row
        for row in OutboxMessage.objects.filter(pk__in=[ids[pk] for pk in pks]).values(
            "pk", "event_type", "payload"
        )
    }
    for pk in pks:
        message_id = ids[pk]
        message = messages.get(message_id)
        if message is None:
            into.results[message_id] = Result.SKIPPED
            continue
        single, outcome = _run_one(
            consumer=consumer,
            pk=pk,
            message_id=message_id,
            event_type=message["event_type"],
            payload=message["payload"],
            apply=apply,
            atomic=atomic,
            ahead=pk in ahead,
        )
        into.results[message_id] = single
        into.outcomes[message_id] = outcome


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
