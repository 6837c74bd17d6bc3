"""Delete finished keys past their retention in bounded batches, paced when the backlog is small."""

from __future__ import annotations

from django.conf import settings
from django.db import connection

from core.db import delete_in_batches

from ..models import FINISHED, IdempotencyKey


def keys_purge_capacity() -> float:
    """Return the most keys a second the purge deletes at the settings: one run's bound
    (IDEMPOTENCY_PURGE_BATCH x IDEMPOTENCY_PURGE_MAX_BATCHES) every IDEMPOTENCY_PURGE_EVERY.

    A backlog above one run's bound is deleted unpaced, so this is what the
    purge keeps up with; it must stay at least 4 x the keyed orders a second
    the shop takes (docs/performance.md, "The key purge").
    """
    per_run = int(settings.IDEMPOTENCY_PURGE_BATCH) * int(settings.IDEMPOTENCY_PURGE_MAX_BATCHES)
    return per_run / float(settings.IDEMPOTENCY_PURGE_EVERY)


def keys_purge(
    *,
    retention: float | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
    pace: float | None = None,
) -> int:
    """Delete finished keys older than the retention, in bounded batches; never an open key.

    While the backlog fits in this run (at most `batch_size` x `max_batches`
    keys are due, one bounded count on the purge's index) it pauses after each
    full batch `pace` (IDEMPOTENCY_PURGE_PACE) times as long as the batch took:
    the purge yields the database to checkout, whose key rows share the table
    and its index. A backlog larger than one run is deleted unpaced, so the
    purge's capacity is its settings' bound, `keys_purge_capacity()`
    (docs/performance.md, "The key purge").
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
    if pace > 0 and _backlog_exceeds(due, [FINISHED, retention], bound=batch_size * max_batches):
        pace = 0.0
    return delete_in_batches(
        f"DELETE FROM {table} WHERE id IN ({due} FOR UPDATE SKIP LOCKED)",
        [FINISHED, retention],
        batch=batch_size,
        max_batches=max_batches,
        durable=True,
        pace=pace,
    )


def _backlog_exceeds(due: str, params: list, *, bound: int) -> bool:
    """Whether more than `bound` keys are due for the purge (a count that stops at bound + 1)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM ({due}) AS due", [*params, bound + 1])
        (count,) = cursor.fetchone()
    return count > bound
