"""The sweeper: lease the due rows and ring their task, topping its queue up to one batch."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import connection, transaction

from .doorbell import registered_task, wire_id
from .rows import ATTEMPT_OWNER_PREFIX, DueWork, default_owner

logger = logging.getLogger("core.due")


def lease_due(
    model: type[DueWork], *, limit: int = 100, owner: str | None = None, lease: float | None = None
) -> list:
    """Lease up to `limit` due rows and return their ids, oldest due first.

    One statement: the due rows are selected `FOR UPDATE SKIP LOCKED` (a
    concurrent sweeper skips them instead of waiting or taking them too) and
    leased for `lease` seconds (default: the policy's) past the database's
    `now()`. A row whose lease has expired is due again.
    """
    meta = model._meta
    table = connection.ops.quote_name(meta.db_table)
    pk = connection.ops.quote_name(meta.pk.column)  # type: ignore[arg-type]  # a pk has a column
    seconds = model.due_policy().lease if lease is None else lease
    owner = (owner or default_owner())[:100]
    if owner.startswith(ATTEMPT_OWNER_PREFIX):
        raise ValueError(f"a sweeper's owner may not look like an attempt's token: {owner!r}")
    sql = (
        f"WITH due AS (SELECT {pk} FROM {table}"
        "  WHERE done_at IS NULL AND NOT needs_attention AND next_attempt_at <= now()"
        "   AND (lease_expires_at IS NULL OR lease_expires_at <= now())"
        f"  ORDER BY next_attempt_at, {pk} LIMIT %s FOR UPDATE SKIP LOCKED)"
        f" UPDATE {table} AS t SET lease_owner = %s,"
        "  lease_expires_at = now() + make_interval(secs => %s)"
        f" FROM due WHERE t.{pk} = due.{pk} RETURNING t.{pk}, t.next_attempt_at"
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, [limit, owner, seconds])
        rows = cursor.fetchall()
    return [row[0] for row in sorted(rows, key=lambda r: (r[1], r[0]))]


def sweep(model: type[DueWork], *, limit: int = 100, owner: str | None = None) -> list:
    """Claim due rows and enqueue the kind's task for each id (a beat sweeper's whole body).

    The sweep tops its task's queue up to `limit` waiting messages, never
    beyond (`sweep_room`): with the queue full it claims nothing.
    """
    name = model.due_policy().task
    if name is None:
        raise ValueError(f"{model.__name__} has no task to enqueue")
    room = sweep_room(name, limit=limit)
    if room == 0:
        return []
    ids = lease_due(model, limit=room, owner=owner)
    task = registered_task(name)
    for pk in ids:
        if task is not None:
            task.delay(wire_id(pk))
        else:
            current_app.send_task(name, args=[wire_id(pk)])
    return ids


def queue_of(task_name: str) -> str:
    """Return the name of the queue task `task_name` is routed to (CELERY_TASK_ROUTES)."""
    return current_app.amqp.router.route({}, task_name)["queue"].name


@contextmanager
def _broker_channel() -> Iterator[tuple[Any, Any]]:
    """A (connection, channel) to the broker that gives up within BROKER_PUBLISH_TIMEOUT."""
    timeout = float(settings.BROKER_PUBLISH_TIMEOUT)
    if settings.BROKER_IS_REDIS:
        options: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "max_retries": 0,
        }
    else:
        options = {"read_timeout": timeout, "write_timeout": timeout}
    with current_app.connection_for_write(
        connect_timeout=timeout, heartbeat=0, transport_options=options
    ) as conn:
        conn.ensure_connection(max_retries=0)  # `channel()` alone tries twice, 2 s apart
        channel: Any = conn.channel()
        try:
            yield conn, channel
        finally:
            try:
                channel.close()
            except Exception:  # noqa: BLE001, S110 - closed by the broker already
                pass


def queued(task_name: str) -> int | None:
    """Return how many messages wait in task `task_name`'s queue, or None when the broker
    does not say within BROKER_PUBLISH_TIMEOUT.

    Waiting means ready, not yet taken by a worker: Redis's list, RabbitMQ's
    ready count (a passive declare; a queue never declared, or on Redis an
    empty one, holds none). Messages a worker has taken (prefetched, or held
    for their ETA) are not counted: they are on their way.
    """
    queue = queue_of(task_name)
    try:
        with _broker_channel() as (conn, channel):
            try:
                return int(channel.queue_declare(queue=queue, passive=True).message_count)
            except conn.channel_errors:
                return 0  # NOT_FOUND: no such queue, so nothing waits in it
    except Exception as exc:  # noqa: BLE001 - the broker is down or hung: the caller decides
        logger.warning("could not count the messages in queue %s: %s", queue, exc)
        return None


# The most messages of one queue `queued_tasks` reads; a longer queue is not told apart.
QUEUE_PEEK = 500
# A waiting message whose task cannot be read: it may be any task's.
ANY_TASK = "*"


def queued_tasks(queue: str, *, peek: int = QUEUE_PEEK) -> set[str] | None:
    """Return the names of the tasks whose messages wait in `queue` (ANY_TASK for a message
    whose task cannot be read), or None when the broker cannot tell them apart.

    Only Redis shows a waiting message without taking it: its lists (one per
    priority step, kombu's layout) are read, at most `peek` messages in all,
    and each message's `headers.task` (Celery's message protocol 2) named.
    None: RabbitMQ (reading a ready message takes it), a queue longer than
    `peek`, or a broker that does not answer within BROKER_PUBLISH_TIMEOUT;
    the caller then judges by the whole queue, as `queued` counts it.
    """
    if not settings.BROKER_IS_REDIS:
        return None
    names: set[str] = set()
    try:
        with _broker_channel() as (_conn, channel):
            client = channel.client
            for step in channel.priority_steps:
                key = channel._q_for_pri(queue, step)  # kombu's name of that priority's list
                raw = client.lrange(key, 0, peek)
                if len(raw) > peek:
                    return None
                peek -= len(raw)
                names.update(_task_of(message) for message in raw)
    except Exception as exc:  # noqa: BLE001 - the broker is down or hung: the caller decides
        logger.warning("could not read the messages in queue %s: %s", queue, exc)
        return None
    return names


def _task_of(raw: bytes | str) -> str:
    try:
        task = json.loads(raw)["headers"]["task"]
    except (ValueError, KeyError, TypeError):
        return ANY_TASK
    return task if isinstance(task, str) else ANY_TASK


def sweep_room(task_name: str, *, limit: int) -> int:
    """Return how many rows a sweep of `limit` may ring for now: `limit` less the messages
    already waiting in the task's queue, at least 0.

    The feedback this cuts: a ring's row is leased for `policy.lease` (90 s
    for a compensation step), and a ring that waits in the queue longer than
    that is rung again by the next sweep. With the queue more than a lease
    long, every sweep adds one more ring per pending row, and the workers
    spend their time on tasks that find their row not due
    (docs/architecture.md, "Due work", `sweep`). Topping the queue up to one
    batch bounds what the sweeps add to `limit` messages, whatever the rings
    from requests do. A lost ring is still rung again once its lease runs out
    and the queue is short (a broker that restarted empty has room at once).
    When the broker does not say (`queued` is None) the sweep takes its whole
    batch, as without this: ringing then fails and frees the rows, or it
    works; a sweep never stops for a count it could not read.
    """
    waiting = queued(task_name)
    if waiting is None:
        return limit
    return max(0, limit - waiting)
