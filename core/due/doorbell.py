"""The doorbell: a task rung for a row by id, best effort, the row leased for its ring."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.models import F
from django.db.models.functions import Greatest, Now

from core.db import database_now

from .rows import DueWork, attempt_running, default_owner, free_lease_values
from .timing import countdown

logger = logging.getLogger("core.due")


def wire_id(pk):
    """Ids travel as JSON: integers as they are, anything else (UUIDs) as text."""
    return pk if isinstance(pk, int) else str(pk)


def registered_task(name: str):
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
    model.objects.filter(pk__in=list(pks)).pending().exclude(attempt_running()).update(
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
        model.objects.filter(pk__in=list(pks)).exclude(attempt_running()).update(
            **free_lease_values()
        )


def release_ring_lease(model: type[DueWork], pks: Sequence, *, owner: str | None) -> None:
    """A ring that was not sent frees its rows' lease: the next sweep rings them (best effort)."""
    if owner is None or not pks:
        return
    try:
        model.objects.filter(pk__in=list(pks), lease_owner=owner).update(**free_lease_values())
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
            options["eta"] = database_now() + timedelta(seconds=countdown(delay))
    except DatabaseError:
        return  # no clock to ring by, no lease: the sweeper finds the row when it is due
    try:
        current_app.send_task(name, args=[wire_id(pk)], retry=False, **options)
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
