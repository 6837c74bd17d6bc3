"""The outbox relay: claim due outbox rows, write their deliveries, publish them, mark them.

The broker is a doorbell, the database is the ledger (docs/events.md, "The relay"):

    relay_once        one batch: lease_due (FOR UPDATE SKIP LOCKED) -> a batch short of a ring
                      with young rows lingers (OUTBOX_RELAY_LINGER) and claims again ->
                      deliveries upserted and
                      leased (committed) -> one Celery task per consumer per batch of ids
                      (OUTBOX_CONSUMER_BATCH, or the consumer's own `batch`) on one
                      producer connection -> failpoint
                      `relay.published` -> rows marked done
    deliveries_sweep  re-publish deliveries no ring can still be on its way for: an attempt
                      failed (lease freed), or the lease ran out undone while no ring
                      of its consumer waits in the queue (the broker lost the message,
                      a worker died)
    outbox_purge      delete published rows past OUTBOX_RETENTION whose deliveries are all done
    register_consumer the apps name their consumers here in ready(); the relay never imports them

A crash between publish and mark publishes the batch again (at least once, by
design): the consumers suppress the copy. Several relays in parallel never
hold one row at once: the claim is one `FOR UPDATE SKIP LOCKED` statement
and the lease outlives it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from celery import current_app
from django.conf import settings
from django.db import connection, transaction

from core import due
from core.db import delete_in_batches

from ..failpoints import failpoint
from ..models import Delivery, OutboxMessage

logger = logging.getLogger(__name__)

ALL_TYPES = "*"


@dataclass(frozen=True)
class Consumer:
    name: str  # the delivery's `consumer` (and the inbox's, when it uses one)
    task: str  # Celery task name, called with a list of outbox message ids (text)
    event_types: frozenset[str]  # the types it subscribes to; ALL_TYPES for every type
    batch: int | None = None  # ids per ring; None: OUTBOX_CONSUMER_BATCH

    def wants(self, event_type: str) -> bool:
        return ALL_TYPES in self.event_types or event_type in self.event_types


_consumers: dict[str, Consumer] = {}


def register_consumer(
    name: str, *, task: str, event_types: Iterable[str], batch: int | None = None
) -> None:
    """Subscribe consumer `name` (Celery task `task`) to `event_types` (call in AppConfig.ready).

    `batch`: ids per ring for this consumer, when OUTBOX_CONSUMER_BATCH does not
    suit it (the e-mails consumer's SHOP_EMAILS_BATCH).
    """
    consumer = Consumer(name=name, task=task, event_types=frozenset(event_types), batch=batch)
    existing = _consumers.get(name)
    if existing is not None and existing != consumer:
        raise ValueError(f"consumer {name!r} is registered twice, differently")
    _consumers[name] = consumer


def consumers() -> dict[str, Consumer]:
    """Return the registered consumers by name."""
    return dict(_consumers)


def consumers_for(event_type: str) -> list[Consumer]:
    return [c for c in _consumers.values() if c.wants(event_type)]


def ring_size(name: str) -> int:
    """Return consumer `name`'s batch: ids per ring, and the most rows one run claims."""
    found = _consumers.get(name)
    return max(1, (found.batch if found else None) or settings.OUTBOX_CONSUMER_BATCH)


class PublishError(Exception):
    """The broker refused or could not be reached: nothing was marked, the rows are due again."""


# -- publishing -------------------------------------------------------------------------


def rings(pairs: list[tuple[str, str]], *, size: int | None = None) -> list[tuple[str, list[str]]]:
    """Group (task name, message id) pairs into batches: one (task, ids) per `size` ids of a task.

    `size` defaults to the task's consumer's own `batch`, else
    OUTBOX_CONSUMER_BATCH. Ids keep their order within a task (the relay's
    claim order); a task's batch never mixes consumers, since each consumer
    has its own task.
    """
    own = {c.task: c.batch for c in _consumers.values() if c.batch}
    by_task: dict[str, list[str]] = {}
    for task_name, message_id in pairs:
        by_task.setdefault(task_name, []).append(message_id)
    out = []
    for task_name, ids in by_task.items():
        step = max(1, size or own.get(task_name) or settings.OUTBOX_CONSUMER_BATCH)
        out += [(task_name, ids[start : start + step]) for start in range(0, len(ids), step)]
    return out


def publish(pairs: list[tuple[str, str]]) -> None:
    """Enqueue the deliveries (task name, message id): one task message per batch of ids.

    One broker message rings for up to OUTBOX_CONSUMER_BATCH deliveries of one
    consumer (the consumer claims and applies them together); all on one
    producer connection.
    """
    if not pairs:
        return
    app = current_app
    try:
        with app.producer_or_acquire() as producer:
            for task_name, ids in rings(pairs):
                app.send_task(task_name, args=[ids], producer=producer, retry=False)
    except Exception as exc:  # noqa: BLE001 - any broker failure: publish again later
        raise PublishError(str(exc)) from exc


# The deliveries of a batch: inserted, or (a republish of a crashed batch) counted again.
# Leased by the publisher for the delivery timeout; due at once, so the consumer's first
# run is attempt 1. A delivery already done or dead-lettered is left alone.
_UPSERT_DELIVERIES = (
    "INSERT INTO idempotency_delivery AS d (consumer, message_id, publishes, lease_owner,"
    " lease_expires_at, next_attempt_at, attempts, needs_attention, last_error, created_at,"
    " updated_at)"
    " SELECT c, m::uuid, 1, %(owner)s, now() + make_interval(secs => %(timeout)s), now(), 0,"
    " false, '', now(), now() FROM unnest(%(consumers)s::text[], %(messages)s::text[]) AS u(c, m)"
    " ON CONFLICT (consumer, message_id) DO UPDATE SET publishes = d.publishes + 1,"
    "  lease_owner = EXCLUDED.lease_owner, lease_expires_at = EXCLUDED.lease_expires_at,"
    "  updated_at = now()"
    " WHERE d.done_at IS NULL AND NOT d.needs_attention"
    " RETURNING d.consumer, d.message_id"
)


def _deliveries_write(rows: list[tuple[str, str]], *, owner: str) -> list[tuple[str, str]]:
    """Upsert and lease the deliveries of (consumer, message id) pairs; return those to publish."""
    if not rows:
        return []
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            _UPSERT_DELIVERIES,
            {
                "owner": owner[:100],
                "timeout": float(settings.OUTBOX_DELIVERY_TIMEOUT),
                "consumers": [c for c, _ in rows],
                "messages": [m for _, m in rows],
            },
        )
        return [(c, str(m)) for c, m in cursor.fetchall()]


def _pairs(deliveries: list[tuple[str, str]]) -> list[tuple[str, str]]:
    registered = _consumers
    pairs = []
    for consumer, message_id in deliveries:
        found = registered.get(consumer)
        if found is None:
            logger.warning("delivery %s/%s: consumer not registered here", consumer, message_id)
            continue
        pairs.append((found.task, message_id))
    return pairs


def _claim(limit: int, owner: str) -> tuple[list, dict, float]:
    """Lease up to `limit` due outbox rows: their ids (claim order), types by id, and the
    age in seconds of the oldest (database clock; 0 when none)."""
    ids = due.lease_due(OutboxMessage, limit=limit, owner=owner)
    if not ids:
        return [], {}, 0.0
    types: dict = {}
    oldest = 0.0
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, event_type, EXTRACT(EPOCH FROM now() - created_at)::float"
            " FROM idempotency_outboxmessage WHERE id = ANY(%s::uuid[])",
            [[str(pk) for pk in ids]],
        )
        for pk, event_type, age in cursor.fetchall():
            types[pk] = event_type
            oldest = max(oldest, float(age))
    return ids, types, oldest


def linger_for(*, claimed: int, oldest: float, limit: int) -> float:
    """Return how long the relay waits for more rows before it publishes `claimed` of them.

    It lingers (OUTBOX_RELAY_LINGER) only to fill a ring: fewer than a ring
    (OUTBOX_CONSUMER_BATCH) and fewer than `limit` claimed, and the oldest
    claimed row, lingered on, still younger than OUTBOX_RELAY_LINGER_SHARE of
    the lag target (OUTBOX_LAG_TARGET). A relay behind (the lag near its
    target) or a full ring never waits (docs/events.md, "The relay").
    """
    linger = float(settings.OUTBOX_RELAY_LINGER)
    if linger <= 0 or claimed >= min(limit, settings.OUTBOX_CONSUMER_BATCH):
        return 0.0
    share = float(settings.OUTBOX_RELAY_LINGER_SHARE) * float(settings.OUTBOX_LAG_TARGET)
    return linger if oldest + linger <= share else 0.0


def relay_once(*, limit: int | None = None, owner: str | None = None) -> int:
    """Relay one batch of due outbox rows; return how many rows were published and marked.

    A batch short of a ring whose rows are young waits `linger_for` once and
    claims what came meanwhile, so a trickle makes fewer, fuller rings.

    Raise PublishError when the broker failed: the batch's leases are freed
    (its rows are due again at once), nothing is marked, no attempt is spent
    (a broker outage is not the message's fault; publishing is retried for ever).
    """
    owner = owner or f"relay:{due.default_owner()}"
    limit = limit or settings.OUTBOX_RELAY_BATCH
    ids, types, oldest = _claim(limit, owner)
    if not ids:
        return 0
    wait = linger_for(claimed=len(ids), oldest=oldest, limit=limit)
    if wait > 0:
        time.sleep(wait)
        more, more_types, _ = _claim(limit - len(ids), owner)
        ids += more
        types.update(more_types)
    wanted = [
        (consumer.name, str(pk))
        for pk in ids
        if pk in types
        for consumer in consumers_for(types[pk])
    ]
    try:
        publish(_pairs(_deliveries_write(wanted, owner=owner)))
    except PublishError as exc:
        OutboxMessage.objects.filter(pk__in=ids, lease_owner=owner[:100]).update(
            lease_owner="", lease_expires_at=None, last_error=due.truncate_error(exc)
        )
        raise
    failpoint("relay.published")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE idempotency_outboxmessage SET done_at = now(), lease_owner = '',"
            " lease_expires_at = NULL, last_error = '' WHERE id = ANY(%s::uuid[])"
            " AND done_at IS NULL",
            [[str(pk) for pk in ids]],
        )
    return len(ids)


# Due deliveries no ring can still be on its way for, leased by the sweeper (as
# `core.due.lease_due` leases, one statement): a free lease (an attempt failed and
# freed it, a publish failed), or one that ran out while no ring of the consumer
# waits in its queue (`%(waiting)s`: the consumers with a ring in their queue). A ring
# that waits claims its own rows and whatever else is fresh for its consumer, so
# ringing again a backlog that is merely queued would only feed it.
_SWEEP = (
    "WITH due AS (SELECT id FROM idempotency_delivery"
    "  WHERE done_at IS NULL AND NOT needs_attention AND next_attempt_at <= now()"
    "   AND (lease_expires_at IS NULL OR lease_expires_at <= now())"
    "   AND (lease_owner = '' OR lease_expires_at IS NULL"
    "    OR NOT consumer = ANY(%(waiting)s::text[]))"
    "  ORDER BY next_attempt_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"
    " UPDATE idempotency_delivery AS t SET lease_owner = %(owner)s,"
    "  lease_expires_at = now() + make_interval(secs => %(lease)s),"
    "  publishes = t.publishes + 1, updated_at = now()"
    " FROM due WHERE t.id = due.id RETURNING t.id, t.consumer, t.message_id"
)


def _waiting_consumers() -> list[str]:
    """The consumers with a ring waiting for a worker in their task's queue.

    Judged per consumer: the consumers share a queue (`events`), and a ring of
    one says nothing of another's rows. A queue that holds messages is read
    (`core.due.queued_tasks`) and a consumer waits when a message of its task
    is there; a message whose task cannot be read, or a queue the broker
    cannot show (RabbitMQ, or longer than `core.due.QUEUE_PEEK`), counts for
    every consumer of the queue. A queue the broker does not count
    (`core.due.queued` is None) counts as empty, as for `core.due.sweep_room`:
    the sweep never stops for a count it could not read.
    """
    by_queue: dict[str, list[Consumer]] = {}
    for consumer in _consumers.values():
        by_queue.setdefault(due.queue_of(consumer.task), []).append(consumer)
    waiting: list[str] = []
    for queue, members in by_queue.items():
        if not due.queued(members[0].task):
            continue
        tasks = due.queued_tasks(queue) if len(members) > 1 else None
        if tasks is None or due.ANY_TASK in tasks:
            waiting += [consumer.name for consumer in members]
        else:
            waiting += [consumer.name for consumer in members if consumer.task in tasks]
    return waiting


def deliveries_sweep(*, limit: int = 1000, owner: str | None = None) -> int:
    """Publish again the deliveries no ring can still be on its way for; return how many.

    A delivery is rung again once its lease is free (its attempt failed) or ran
    out while its consumer's queue holds no waiting ring (`_SWEEP`).
    """
    owner = owner or f"sweep:{due.default_owner()}"
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            _SWEEP,
            {
                "waiting": _waiting_consumers(),
                "limit": limit,
                "owner": owner[:100],
                "lease": float(Delivery.due_policy().lease),
            },
        )
        rows = sorted(cursor.fetchall())
    if not rows:
        return 0
    ids = [pk for pk, _, _ in rows]
    try:
        publish(_pairs([(c, str(m)) for _, c, m in rows]))
    except PublishError as exc:
        Delivery.objects.filter(pk__in=ids, lease_owner=owner[:100]).update(
            lease_owner="", lease_expires_at=None
        )
        logger.warning("delivery sweep: broker unavailable (%s); due again", exc)
        return 0
    return len(rows)


def deliveries_ring(pks: Iterable[int]) -> int:
    """Publish the deliveries `pks` now (staff requeue), best effort; return how many."""
    rows = list(Delivery.objects.filter(pk__in=list(pks)).values_list("consumer", "message_id"))
    try:
        publish(_pairs([(c, str(m)) for c, m in rows]))
    except PublishError as exc:
        logger.warning("requeue: broker unavailable (%s); the sweeper will publish", exc)
        return 0
    return len(rows)


def outbox_purge(*, batch: int | None = None, max_batches: int | None = None) -> int:
    """Delete published rows older than OUTBOX_RETENTION whose deliveries are all done.

    Bounded batches (each its own short transaction); a message with a pending
    delivery or a dead letter is kept so that staff can still requeue it.
    """
    batch = batch or settings.OUTBOX_PURGE_BATCH
    max_batches = max_batches or settings.OUTBOX_PURGE_MAX_BATCHES
    return delete_in_batches(
        "WITH old AS (SELECT o.id FROM idempotency_outboxmessage o"
        " WHERE o.done_at < now() - make_interval(secs => %s)"
        " AND NOT EXISTS (SELECT 1 FROM idempotency_delivery d"
        "   WHERE d.message_id = o.id AND d.done_at IS NULL)"
        " ORDER BY o.done_at LIMIT %s FOR UPDATE SKIP LOCKED),"
        " gone AS (DELETE FROM idempotency_delivery d USING old"
        "   WHERE d.message_id = old.id)"
        " DELETE FROM idempotency_outboxmessage o USING old WHERE o.id = old.id",
        [float(settings.OUTBOX_RETENTION)],
        batch=batch,
        max_batches=max_batches,
    )


def relay_for(seconds: float, *, owner: str | None = None) -> int:
    """Relay batches until the outbox is empty or `seconds` have passed (the beat fallback)."""
    deadline = time.monotonic() + seconds
    total = 0
    while time.monotonic() < deadline:
        done = relay_once(owner=owner)
        total += done
        if done < settings.OUTBOX_RELAY_BATCH:
            break
    return total
