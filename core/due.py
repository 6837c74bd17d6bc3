"""Due work: every piece of pending, retried work is a row (docs/architecture.md, "Due work").

The broker is a doorbell, the database is the ledger. A kind of due work
(settlements, outbox messages, refunds, compensation steps, shopper mails, webhook
deliveries) is a concrete model inheriting `DueWork`, with a `due_policy()`
naming its Celery task, attempt budget, backoff and lease. Everything below
takes the model class and row ids, never instances, and judges time by the
database's clock (`now()`), never the worker's.

    lease_due          beat sweeper: lease due rows (FOR UPDATE SKIP LOCKED), return ids
    sweep              lease_due + enqueue the task for each id, topping its queue up
                       to one batch (sweep_room: a long queue gets no more rings)
    attempt_begin      count one attempt, take the attempt's lease (its worst case) and
                       push next_attempt_at back by the backoff, before the work calls out;
                       exactly one runner wins, and none while an attempt's lease runs
    attempt_failed     record the error, free the lease; spent budget -> needs_attention
    mark_done          the work is done (done_at), nothing is due any more
    flag_attention     stop retrying, staff decide (needs_attention + reason)
    fence              a queryset narrowed to "this attempt still holds the row"

Every write of an attempt takes the `Attempt` that `attempt_begin` returned
(`attempt=`): it is conditional on the attempt's fencing token, so a stale
runner (its lease run out, another attempt begun) changes nothing. The kind's
own columns (a status) go in the same UPDATE (`values=`, `attention_values=`,
`retry_values=`), so the flag and the status never commit apart.
    retry_now          staff: fresh budget, due now, ring the bell after commit
    leave_for_sweep    a task rung for rows leaves some untried: the next sweep rings them
    ring, ring_after_commit   the doorbell: the task by id, best effort (later: database clock);
                       the row is leased as a sweep leases it, so no sweep rings it again
                       while the ring is on its way
    backoff, countdown, retry_countdown   the one backoff (with jitter) and its Celery cap
    retry_eta          a task's own Celery retry, timed by the database clock

This module imports no other project app.
"""

from __future__ import annotations

import enum
import functools
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import DatabaseError, connection, models, transaction
from django.db.models import F, Q
from django.db.models.functions import Greatest, Now

from .db import database_now, database_now_estimate

LAST_ERROR_MAX = 500
# A task's own Celery retries (the database blinking) wait at most this long
# before the cap below; longer waits are the row's `next_attempt_at`.
RETRY_BACKOFF_CAP = 10.0

logger = logging.getLogger(__name__)


def truncate_error(error: object) -> str:
    """Return `error` as text that fits `last_error` (CharField(500)), keeping its start."""
    text = str(error)
    return text if len(text) <= LAST_ERROR_MAX else text[: LAST_ERROR_MAX - 1] + "…"


# -- backoff ---------------------------------------------------------------------------


def backoff(attempt: int, *, base: float, cap: float) -> float:
    """Return seconds to wait after attempt `attempt` (1-based): exponential, capped, jittered.

    `min(base * 2**(attempt - 1), cap)` with equal jitter: half of it fixed,
    half random, so runners that failed together do not return together.
    """
    ceiling = min(base * 2.0 ** min(max(attempt - 1, 0), 64), cap)
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def max_countdown() -> float:
    """Return the largest Celery countdown any task may use.

    On Redis a message is unacked from its delivery (countdown included)
    until its task ends; past the visibility timeout Redis hands it to a
    second worker. So countdown + the hard time limit stays below the
    visibility timeout, whatever the settings say about CELERY_MAX_COUNTDOWN.
    RabbitMQ has no visibility timeout; the same window
    (CELERY_VISIBILITY_TIMEOUT) bounds it there, so both brokers cap alike.
    """
    visibility = float(
        settings.CELERY_BROKER_TRANSPORT_OPTIONS.get(
            "visibility_timeout", settings.CELERY_VISIBILITY_TIMEOUT
        )
    )
    by_limits = visibility - float(settings.CELERY_TASK_TIME_LIMIT) - 1
    return max(0.0, min(float(settings.CELERY_MAX_COUNTDOWN), by_limits))


def countdown(delay: float) -> float:
    """Return a Celery countdown for `delay` seconds, clamped to [0, max_countdown()]."""
    return max(0.0, min(float(delay), max_countdown()))


def retry_countdown(retries: int) -> float:
    """Return the countdown of a task's Celery retry number `retries + 1` (self.request.retries)."""
    return countdown(backoff(retries + 1, base=1.0, cap=RETRY_BACKOFF_CAP))


def retry_eta(retries: int) -> datetime:
    """Return the ETA of a task's Celery retry number `retries + 1`, by the database clock.

    `self.retry(countdown=…)` would become an ETA on this host's clock, which
    the worker that receives it judges by its own: the others would hold the
    retries of a host ahead by as much as it is ahead (as they would its rings
    for later, `ring`). The retry follows a lost connection, so the clock is
    not asked again: `database_now_estimate` (this process's offset from the
    database clock, as last read).
    """
    return datetime.fromtimestamp(database_now_estimate() + retry_countdown(retries), tz=UTC)


# -- the row ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DuePolicy:
    """How one kind of due work is retried. Build it from settings at call time."""

    task: str | None  # Celery task name, called with one row id; None: no bell (sweeper only)
    max_attempts: int  # the attempt budget; then needs_attention
    backoff_base: float  # seconds after attempt 1, doubling per attempt ...
    backoff_max: float  # ... up to this
    lease: float  # seconds a leased row is not leased again (longer than the queue wait)
    # Seconds one attempt may still be running at worst (its calls' timeouts,
    # look-ups and a margin); None: `lease`. No second attempt begins before.
    attempt_lease: float | None = None

    @property
    def attempt_lease_seconds(self) -> float:
        """The attempt's lease in seconds (`attempt_lease`, else `lease`)."""
        return float(self.lease if self.attempt_lease is None else self.attempt_lease)

    def backoff(self, attempt: int) -> float:
        """Return seconds to wait after attempt `attempt` of this kind."""
        return backoff(attempt, base=self.backoff_base, cap=self.backoff_max)

    @classmethod
    def from_settings(
        cls,
        prefix: str,
        *,
        task: str | None,
        lease: float | None = None,
        attempt_lease: float | None = None,
    ) -> DuePolicy:
        """Build a kind's policy from its settings, read now (tests override them).

        `<prefix>_MAX_ATTEMPTS`, `<prefix>_BACKOFF_BASE`, `<prefix>_BACKOFF_MAX`
        and, unless `lease` is given, `<prefix>_LEASE` (e.g. `COMPENSATION`).
        """
        return cls(
            task=task,
            max_attempts=getattr(settings, f"{prefix}_MAX_ATTEMPTS"),
            backoff_base=getattr(settings, f"{prefix}_BACKOFF_BASE"),
            backoff_max=getattr(settings, f"{prefix}_BACKOFF_MAX"),
            lease=getattr(settings, f"{prefix}_LEASE") if lease is None else lease,
            attempt_lease=attempt_lease,
        )


class DueWorkQuerySet(models.QuerySet):
    def pending(self) -> DueWorkQuerySet:
        """Rows not done and not waiting for staff (due now or later)."""
        return self.filter(done_at__isnull=True, needs_attention=False)

    def due(self) -> DueWorkQuerySet:
        """Rows whose time has come by the database clock and whose lease is free."""
        return (
            self.pending()
            .filter(next_attempt_at__lte=Now())
            .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=Now()))
        )


class DueWork(models.Model):
    """A row of pending work: when it is due, how often it was tried, who holds it, why it stopped.

    Subclasses add their own columns and define `due_policy()`; they index
    due rows with `due_index(name=...)`.
    """

    # Database defaults too, so a kind may insert its rows in raw SQL
    # (`INSERT ... ON CONFLICT`) naming only the columns it cares about.
    next_attempt_at = models.DateTimeField(db_default=Now())
    attempts = models.PositiveIntegerField(default=0, db_default=0)
    # The sweeper that enqueued the row and until when (database clock); an
    # expired lease makes the row due again.
    lease_owner = models.CharField(max_length=100, blank=True, default="", db_default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    needs_attention = models.BooleanField(default=False, db_default=False)
    last_error = models.CharField(max_length=LAST_ERROR_MAX, blank=True, default="", db_default="")
    done_at = models.DateTimeField(null=True, blank=True)

    objects = DueWorkQuerySet.as_manager()

    class Meta:
        abstract = True

    @classmethod
    def due_policy(cls) -> DuePolicy:
        raise NotImplementedError(f"{cls.__name__} must define due_policy()")


def due_index(*, name: str) -> models.Index:
    """Return the partial index the sweeper's lease uses: pending rows by `next_attempt_at`."""
    return models.Index(
        fields=["next_attempt_at"],
        name=name,
        condition=Q(done_at__isnull=True, needs_attention=False),
    )


def _touch(model: type[DueWork]) -> dict[str, Any]:
    """Also move `updated_at` when the kind has one."""
    names = {f.name for f in model._meta.concrete_fields}
    return {"updated_at": Now()} if "updated_at" in names else {}


def _free_lease() -> dict[str, Any]:
    return {"lease_owner": "", "lease_expires_at": None}


def default_owner() -> str:
    """Name this process as a lease owner (host:pid)."""
    return f"{socket.gethostname()}:{os.getpid()}"[:100]


# -- lease -----------------------------------------------------------------------------


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
    task = _task(name)
    for pk in ids:
        if task is not None:
            task.delay(_wire(pk))
        else:
            current_app.send_task(name, args=[_wire(pk)])
    return ids


def queue_of(task_name: str) -> str:
    """Return the name of the queue task `task_name` is routed to (CELERY_TASK_ROUTES)."""
    return current_app.amqp.router.route({}, task_name)["queue"].name


def queued(task_name: str) -> int | None:
    """Return how many messages wait in task `task_name`'s queue, or None when the broker
    does not say within BROKER_PUBLISH_TIMEOUT.

    Waiting means ready, not yet taken by a worker: Redis's list, RabbitMQ's
    ready count (a passive declare; a queue never declared, or on Redis an
    empty one, holds none). Messages a worker has taken (prefetched, or held
    for their ETA) are not counted: they are on their way.
    """
    queue = queue_of(task_name)
    timeout = float(settings.BROKER_PUBLISH_TIMEOUT)
    if settings.BROKER_IS_REDIS:
        options: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "max_retries": 0,
        }
    else:
        options = {"read_timeout": timeout, "write_timeout": timeout}
    try:
        with current_app.connection_for_write(
            connect_timeout=timeout, heartbeat=0, transport_options=options
        ) as conn:
            conn.ensure_connection(max_retries=0)  # `channel()` alone tries twice, 2 s apart
            channel: Any = conn.channel()
            try:
                return int(channel.queue_declare(queue=queue, passive=True).message_count)
            except conn.channel_errors:
                return 0  # NOT_FOUND: no such queue, so nothing waits in it
            finally:
                try:
                    channel.close()
                except Exception:  # noqa: BLE001, S110 - closed by the broker already
                    pass
    except Exception as exc:  # noqa: BLE001 - the broker is down or hung: the caller decides
        logger.warning("could not count the messages in queue %s: %s", queue, exc)
        return None


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


# -- one attempt -----------------------------------------------------------------------


# An attempt's lease is held in the row's lease columns, its owner being the
# attempt's fencing token; a sweeper's lease (the row enqueued) has any other owner.
ATTEMPT_OWNER_PREFIX = "attempt "


@dataclass(frozen=True)
class Attempt:
    """What `attempt_begin` came to: the attempt this runner took, or why none."""

    number: int = 0  # 1-based attempt this runner took; 0: none taken
    budget_spent: bool = False  # the row has used its attempts: flag it, do not work
    token: str = ""  # the fencing token: this attempt's `lease_owner` while it holds the row
    pk: Any = None  # the row this attempt is of

    @property
    def taken(self) -> bool:
        return self.number > 0


class Ended(enum.Enum):
    """How `attempt_failed` ended the attempt. Truthy only for ATTENTION (the budget is spent)."""

    RETRY = "retry"  # recorded; the row is due again after the backoff
    ATTENTION = "attention"  # recorded; the budget is spent: needs_attention
    REFUSED = "refused"  # nothing written: the attempt is stale (or the row done / flagged)

    def __bool__(self) -> bool:
        return self is Ended.ATTENTION


def attempt_token(number: int) -> str:
    """Return a fresh fencing token for attempt `number` (unique; names the runner)."""
    return f"{ATTEMPT_OWNER_PREFIX}{number} {uuid.uuid4().hex[:12]} {default_owner()}"[:100]


def _attempt_running() -> Q:
    """An attempt's lease is held and has not run out (database clock)."""
    return Q(lease_owner__startswith=ATTEMPT_OWNER_PREFIX, lease_expires_at__gt=Now())


def fence(rows: models.QuerySet, attempt: Attempt | None) -> models.QuerySet:
    """Narrow `rows` to those `attempt` still holds (its number and token); None: unfenced.

    A write through the result updates nothing once the attempt is stale:
    its lease ran out and another attempt began, staff retried or flagged the
    row, or it was freed (failed, done). The row count tells the caller.
    """
    if attempt is None:
        return rows
    if not attempt.taken:
        raise ValueError("an attempt that was not taken holds no row")
    return rows.filter(attempts=attempt.number, lease_owner=attempt.token)


def attempt_begin(model: type[DueWork], *, pk, values: dict[str, Any] | None = None) -> Attempt:
    """Count one attempt, take its lease and schedule the next before the work calls out.

    The conditional UPDATE (same attempt count, still due, no attempt's lease
    running) lets exactly one of several concurrent runners (sweeper, bell,
    redelivered message) take the attempt, and refuses every runner while an
    earlier attempt may still be running. It takes the attempt's lease for
    `policy.attempt_lease_seconds` (its worst case; a sweeper's lease is taken
    over, a row rung by the bell gets one here) with a fresh fencing token,
    and pushes `next_attempt_at` back by the backoff. It commits before the
    work: a runner killed mid-work leaves the row due once its lease runs out.
    `values` are the kind's own columns set in the same UPDATE (a status).
    """
    row = model.objects.filter(pk=pk).values("attempts", "done_at", "needs_attention").first()
    if row is None or row["done_at"] is not None or row["needs_attention"]:
        return Attempt()
    policy = model.due_policy()
    if row["attempts"] >= policy.max_attempts:
        if model.objects.filter(pk=pk).filter(_attempt_running()).exists():
            return Attempt()  # the last attempt is still running: it decides
        return Attempt(budget_spent=True)
    number = row["attempts"] + 1
    token = attempt_token(number)
    taken = (
        model.objects.filter(pk=pk, attempts=row["attempts"], next_attempt_at__lte=Now())
        .pending()
        .exclude(_attempt_running())
        .update(
            **{
                **_touch(model),
                **(values or {}),
                "attempts": number,
                "next_attempt_at": Now() + timedelta(seconds=policy.backoff(number)),
                "lease_owner": token,
                "lease_expires_at": Now() + timedelta(seconds=policy.attempt_lease_seconds),
            }
        )
    )
    return Attempt(number=number, token=token, pk=pk) if taken else Attempt()


def attempt_failed(
    model: type[DueWork],
    *,
    pk,
    error: object,
    attention_reason: str | None = None,
    attempt: Attempt | None = None,
    attention_values: dict[str, Any] | None = None,
    retry_values: dict[str, Any] | None = None,
) -> Ended:
    """Record why an attempt failed and free the lease, in one UPDATE; say how it ended.

    The next attempt is already scheduled (by `attempt_begin`). When the
    attempts reach the budget the row gets `needs_attention`, with the reason
    in `last_error` (`attention_reason`, or a generic one), and
    `attention_values`; otherwise `retry_values`: the kind's status moves in
    the same statement as the flag. ATTENTION (truthy) tells the caller to
    write its own event, in the caller's transaction if it has one open.
    With `attempt`, a stale attempt writes nothing (REFUSED).
    """
    budget = model.due_policy().max_attempts
    with transaction.atomic():
        row = (
            fence(model.objects.filter(pk=pk).pending(), attempt)
            .select_for_update()
            .values("attempts")
            .first()
        )
        if row is None:
            return Ended.REFUSED
        spent = row["attempts"] >= budget
        if spent:
            reason = attention_reason or f"attempt budget spent ({budget} attempts): {error}"
            fields = {"needs_attention": True, "last_error": truncate_error(reason)}
            fields.update(attention_values or {})
        else:
            fields = {"last_error": truncate_error(error), **(retry_values or {})}
        model.objects.filter(pk=pk).update(**{**_free_lease(), **_touch(model), **fields})
    return Ended.ATTENTION if spent else Ended.RETRY


def flag_attention(
    model: type[DueWork],
    *,
    pk,
    reason: str,
    only_if_attempts_at_least: int | None = None,
    attempt: Attempt | None = None,
    values: dict[str, Any] | None = None,
) -> bool:
    """Stop retrying the row until staff retry it; return True if this call flagged it.

    `values` (the kind's status) change in the same UPDATE; with `attempt`,
    only while that attempt still holds the row.
    """
    rows = fence(model.objects.filter(pk=pk).pending(), attempt)
    if only_if_attempts_at_least is not None:
        rows = rows.filter(attempts__gte=only_if_attempts_at_least)
    return bool(
        rows.update(
            **{
                **_free_lease(),
                **_touch(model),
                **(values or {}),
                "needs_attention": True,
                "last_error": truncate_error(reason),
            }
        )
    )


def mark_done(
    model: type[DueWork],
    *,
    pk,
    attempt: Attempt | None = None,
    values: dict[str, Any] | None = None,
) -> bool:
    """Mark the row's work done (nothing more is due); return True if this call did it.

    With `attempt`, only while that attempt still holds the row.
    """
    rows = fence(model.objects.filter(pk=pk, done_at__isnull=True), attempt)
    return bool(
        rows.update(
            **{
                **_free_lease(),
                **_touch(model),
                **(values or {}),
                "done_at": Now(),
                "needs_attention": False,
            }
        )
    )


def retry_now(model: type[DueWork], *, pk) -> bool:
    """Give a row a fresh attempt budget, due now, and ring its bell after commit (staff action).

    Return True if the row was reopened (False when it is done already).
    """
    reopened = model.objects.filter(pk=pk, done_at__isnull=True).update(
        needs_attention=False,
        attempts=0,
        next_attempt_at=Now(),
        **_free_lease(),
        **_touch(model),
    )
    if reopened:
        ring_after_commit(model, pk)
    return bool(reopened)


# -- the doorbell ----------------------------------------------------------------------


def _wire(pk):
    """Ids travel as JSON: integers as they are, anything else (UUIDs) as text."""
    return pk if isinstance(pk, int) else str(pk)


def _task(name: str):
    """The registered task object when this process has imported it (so tests can patch it)."""
    return current_app.tasks.get(name)


# Until when (this process's monotonic clock) rings are skipped: set when a ring
# fails. A local pause of a local call, not a decision on shared time, so the
# monotonic clock is the right one here (the database clock judges the rows).
_rings_paused_until = 0.0


# A ring's lease on the rows it rings for; any owner but an attempt's.
RING_OWNER_PREFIX = "ring "


def ring_owner() -> str:
    """Name this process's rings as a lease owner."""
    return f"{RING_OWNER_PREFIX}{default_owner()}"[:100]


def rings_paused() -> bool:
    """True while this process rings nothing (a ring failed a moment ago)."""
    return time.monotonic() < _rings_paused_until


def lease_for_ring(model: type[DueWork], pks: Sequence) -> str | None:
    """Lease rows a ring is about to be sent for, as a sweep leases the rows it rings for.

    Without it every sweep (5 s) rings a row again while its first ring still
    waits in a queue behind a backlog, and again each time a lease runs out:
    the broker fills with rings of the same rows, and a worker behind gets
    further behind (docs/failure-model.md, "What broke, and what fixed it": a
    backlog that fed itself). The lease runs `policy.lease` past the row's due
    time (a ring for later arrives then); a row an attempt holds is left
    alone. In the caller's transaction when one is open: it commits with the
    row, or not at all. Return the owner, or None when nothing will be rung
    (no task; this process's rings are paused: the sweeper rings the row when
    due).
    """
    policy = model.due_policy()
    if policy.task is None or rings_paused() or not pks:
        return None
    owner = ring_owner()
    model.objects.filter(pk__in=list(pks)).pending().exclude(_attempt_running()).update(
        lease_owner=owner,
        lease_expires_at=Greatest(F("next_attempt_at"), Now()) + timedelta(seconds=policy.lease),
    )
    return owner


def leave_for_sweep(model: type[DueWork], pks: Sequence) -> None:
    """Rows a task was rung for and left untried (its time ran out): free their lease.

    The ring that leased them has arrived, so none is on its way: the next
    sweep rings them. A lease an attempt holds is kept.
    """
    if pks:
        model.objects.filter(pk__in=list(pks)).exclude(_attempt_running()).update(**_free_lease())


def release_ring_lease(model: type[DueWork], pks: Sequence, *, owner: str | None) -> None:
    """A ring that was not sent frees its rows' lease: the next sweep rings them (best effort)."""
    if owner is None or not pks:
        return
    try:
        model.objects.filter(pk__in=list(pks), lease_owner=owner).update(**_free_lease())
    except DatabaseError:
        logger.warning("could not free the ring's lease of %d %s rows", len(pks), model.__name__)


def ring(model: type[DueWork], pk, *, delay: float = 0.0, leased_by: str | None = None) -> None:
    """Enqueue the kind's task for row `pk`, now or in `delay` seconds (capped), best effort.

    The row is the truth: a broker that is down or loses the message costs
    only time, because the sweeper finds the row when it is due. So a ring
    never waits long: a failed one (a hung broker waits its socket timeout,
    1 s) pauses this process's rings for BROKER_RING_PAUSE seconds, and every
    request meanwhile goes on without one, instead of each waiting in turn
    (which holds every web thread while the broker hangs:
    docs/failure-model.md, "What broke, and what fixed it").

    A ring for later carries an ETA by the database clock, never a Celery
    countdown: Celery turns a countdown into an ETA on the sending host's
    clock, and the receiving worker judges it by its own, so the other hosts'
    workers would hold the rings of a host ahead by as much as it is ahead
    (docs/failure-model.md, "What broke, and what fixed it"). By the database
    clock, a worker on a host ahead of it runs the ring early: the row is not
    due yet, `attempt_begin` refuses it, and the sweeper rings it when it is.
    A worker on a host behind the database clock reads the ETA by the database
    clock too (`core.patches.worker_clock`), so it does not hold the ring that much
    longer.

    The row is leased for the ring first (`lease_for_ring`; `leased_by`: the
    caller did, in its transaction), and a ring that is not sent frees it.
    """
    global _rings_paused_until
    name = model.due_policy().task
    if name is None:
        return
    if rings_paused():
        release_ring_lease(model, [pk], owner=leased_by)
        return  # the broker failed a moment ago; the sweeper finds the row when due
    options: dict[str, Any] = {}
    try:
        owner = leased_by or lease_for_ring(model, [pk])
        if delay > 0:
            options["eta"] = datetime.fromtimestamp(database_now() + countdown(delay), tz=UTC)
    except DatabaseError:
        return  # no clock to ring by, no lease: the sweeper finds the row when it is due
    try:
        current_app.send_task(name, args=[_wire(pk)], retry=False, **options)
    except Exception:  # noqa: BLE001 - a broker outage must not fail recorded work
        _rings_paused_until = time.monotonic() + settings.BROKER_RING_PAUSE
        release_ring_lease(model, [pk], owner=owner)
        logger.warning(
            "could not ring %s for %s %s; the sweeper will, and this process rings"
            " no more for %.0f s",
            name,
            model.__name__,
            pk,
            settings.BROKER_RING_PAUSE,
        )


def ring_after_commit(model: type[DueWork], pk, *, delay: float = 0.0) -> None:
    """Lease row `pk` for its ring now, in the current transaction, and ring once it commits."""
    ring_many_after_commit(model, [pk], delay=delay)


def ring_many_after_commit(model: type[DueWork], pks: Sequence, *, delay: float = 0.0) -> None:
    """Lease the rows for their rings now (one UPDATE), and ring for each after commit."""
    owner = lease_for_ring(model, pks)
    if owner is None:
        return  # no bell, or rings paused: the sweeper rings the rows when due
    for pk in pks:
        transaction.on_commit(functools.partial(ring, model, pk, delay=delay, leased_by=owner))
