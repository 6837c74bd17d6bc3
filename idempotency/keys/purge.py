"""Delete finished keys past their retention in bounded, paced batches."""

from __future__ import annotations

import math

from django.conf import settings
from django.db import connection

from core.db import delete_in_batches

from ..models import FINISHED, IdempotencyKey


def keys_purge_capacity(*, batch_seconds: float = 0.0) -> float:
    """Return the most keys a second the purge deletes when a batch takes `batch_seconds`.

    A run deletes at most IDEMPOTENCY_PURGE_BATCH x IDEMPOTENCY_PURGE_MAX_BATCHES
    keys every IDEMPOTENCY_PURGE_EVERY, and no more batches than start within
    its IDEMPOTENCY_PURGE_BUDGET at (1 + IDEMPOTENCY_PURGE_PACE) x
    `batch_seconds` each. It must stay at least 4 x the keyed orders a second
    the shop takes (docs/performance.md, "The key purge").
    """
    batch = int(settings.IDEMPOTENCY_PURGE_BATCH)
    every = float(settings.IDEMPOTENCY_PURGE_EVERY)
    batches = int(settings.IDEMPOTENCY_PURGE_MAX_BATCHES)
    paced = (1 + float(settings.IDEMPOTENCY_PURGE_PACE)) * batch_seconds
    if paced > 0:
        batches = min(batches, math.ceil(_run_budget() / paced))
    return batches * batch / every


def keys_purge(
    *,
    retention: float | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
    pace: float | None = None,
) -> int:
    """Delete finished keys older than the retention, in bounded batches; never an open key.

    It pauses after each full batch `pace` (IDEMPOTENCY_PURGE_PACE) times as
    long as the batch took, whatever the backlog: the purge yields the database
    to checkout, whose key rows share the table and its index, and yields more
    the busier the database is. A run starts no batch after
    IDEMPOTENCY_PURGE_BUDGET seconds (at most the interval), so it ends within
    the task's time limit and runs never overlap; its capacity is
    `keys_purge_capacity()` (docs/performance.md, "The key purge").
    """
    retention = float(settings.IDEMPOTENCY_KEY_RETENTION if retention is None else retention)
    batch_size = batch_size or int(settings.IDEMPOTENCY_PURGE_BATCH)
    max_batches = max_batches or int(settings.IDEMPOTENCY_PURGE_MAX_BATCHES)
    pace = float(settings.IDEMPOTENCY_PURGE_PACE if pace is None else pace)
    table = connection.ops.quote_name(IdempotencyKey._meta.db_table)
    due = (
        f"SELECT id FROM {table}"
        "  WHERE recovery_point = %s AND finished_at < now() - make_interval(secs => %s)"
        "  ORDER BY finished_at LIMIT %s"
    )
    return delete_in_batches(
        f"DELETE FROM {table} WHERE id IN ({due} FOR UPDATE SKIP LOCKED)",
        [FINISHED, retention],
        batch=batch_size,
        max_batches=max_batches,
        durable=True,
        pace=pace,
        budget=_run_budget(),
    )


def _run_budget() -> float:
    """Seconds after which a purge run starts no batch: its budget, at most its interval."""
    return min(float(settings.IDEMPOTENCY_PURGE_BUDGET), float(settings.IDEMPOTENCY_PURGE_EVERY))
