"""Delete finished keys past their retention, in bounded, paced batches."""

from __future__ import annotations

from django.conf import settings
from django.db import connection

from core.db import delete_in_batches

from ..models import FINISHED, IdempotencyKey


def keys_purge(
    *,
    retention: float | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
    pace: float | None = None,
) -> int:
    """Delete finished keys older than the retention, in bounded batches; never an open key.

    After each full batch it pauses `pace` (IDEMPOTENCY_PURGE_PACE) times as
    long as the batch took: the purge yields the database to checkout, whose
    key rows share the table and its index (docs/performance.md, "A paced purge").
    """
    retention = float(settings.IDEMPOTENCY_KEY_RETENTION if retention is None else retention)
    batch_size = batch_size or int(settings.IDEMPOTENCY_PURGE_BATCH)
    max_batches = max_batches or int(settings.IDEMPOTENCY_PURGE_MAX_BATCHES)
    pace = float(settings.IDEMPOTENCY_PURGE_PACE if pace is None else pace)
    table = connection.ops.quote_name(IdempotencyKey._meta.db_table)
    sql = (
        f"DELETE FROM {table} WHERE id IN ("
        f" SELECT id FROM {table}"
        "  WHERE recovery_point = %s AND finished_at < now() - make_interval(secs => %s)"
        "  ORDER BY finished_at LIMIT %s FOR UPDATE SKIP LOCKED)"
    )
    return delete_in_batches(
        sql,
        [FINISHED, retention],
        batch=batch_size,
        max_batches=max_batches,
        durable=True,
        pace=pace,
    )
