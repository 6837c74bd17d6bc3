"""Small database helpers shared by every app."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from django.db import IntegrityError, connection, transaction

# The database clock as SQL, for a statement that reads the time together with the
# rows it decides on (orders.limits): the clock `database_now` reads, at the statement's start.
STATEMENT_CLOCK_SQL = "statement_timestamp()"

# This process's clock minus the database's, as last read (seconds); None: never read.
_clock_offset: float | None = None


def database_now() -> datetime:
    """Return the database clock's time (aware, UTC): the one way to read it.

    For a decision a host must not make on its own clock (a host whose clock
    runs ahead would decide differently from the others): the database clock
    is the one clock every host shares (docs/failure-model.md, "Dependency faults").
    It is SQL's `now()`: inside a transaction the transaction's start, so a
    time computed from it agrees with the `Now()` the same transaction
    writes; outside one, the statement's time. Each read also notes how far
    this process's clock is from the statement's time (`database_now_estimate`).
    A caller that needs Unix seconds takes `.timestamp()`.
    """
    global _clock_offset
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT now(), EXTRACT(EPOCH FROM {STATEMENT_CLOCK_SQL})::float")
        now, statement = cursor.fetchone()
    _clock_offset = time.time() - float(statement)
    return now.astimezone(UTC)


def database_now_estimate() -> datetime:
    """The database clock's time without asking it (aware, UTC): this process's clock
    less the offset last read (by `database_now`; a worker's first task reads it:
    config/celery.py).

    For times computed where the database may be the thing that just failed (a
    task's own retry after a lost connection), so a query there could hang: an
    ETA a worker on another host judges by its own clock must not carry this
    host's skew. Never read yet: this process's clock.
    """
    return datetime.fromtimestamp(time.time() - (_clock_offset or 0.0), tz=UTC)


def clock_offset() -> float:
    """This process's clock minus the database's, as last read (0.0: never read)."""
    return _clock_offset or 0.0


def note_clock_offset() -> None:
    """Read the database clock once, unless this process has already, to note its offset
    from it (best effort)."""
    if _clock_offset is not None:
        return
    try:
        database_now()
    except Exception:  # noqa: BLE001, S110 - best effort: the estimate stays this process's clock
        pass


def violated_constraint(exc: IntegrityError) -> str | None:
    """Return the name of the constraint an IntegrityError violated, if PostgreSQL named one."""
    diag = getattr(exc.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None)


def insert_first(instance, *, constraint: str) -> bool:
    """Insert `instance` in a savepoint; False when `constraint` refused it (already done).

    Let the constraint decide: the caller then reads the row that holds the
    scope. Any other integrity error is raised.
    """
    try:
        with transaction.atomic():
            instance.save(force_insert=True)
    except IntegrityError as exc:
        if violated_constraint(exc) != constraint:
            raise
        return False
    return True


# Hot tables vacuum and analyze after ~1-2 % of their rows changed, not the
# defaults' 20 % / 10 %: a table of millions of keys or deliveries would
# otherwise carry hundreds of thousands of dead tuples (a day's purge) in its
# heap and indexes before the first vacuum (docs/performance.md, "Growth").
HOT_TABLE_AUTOVACUUM = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_analyze_scale_factor": "0.02",
    # Insert-mostly tables (outbox, deliveries, inbox) get their visibility
    # map set (index-only scans) and their tuples frozen in small steps.
    "autovacuum_vacuum_insert_scale_factor": "0.02",
}


def hot_table_autovacuum(*tables: str):
    """A migration operation: HOT_TABLE_AUTOVACUUM on `tables` (reversed: the defaults)."""
    from django.db import migrations

    settings = ", ".join(f"{name} = {value}" for name, value in HOT_TABLE_AUTOVACUUM.items())
    names = ", ".join(HOT_TABLE_AUTOVACUUM)
    return migrations.RunSQL(
        sql=[f"ALTER TABLE {table} SET ({settings})" for table in tables],
        reverse_sql=[f"ALTER TABLE {table} RESET ({names})" for table in tables],
    )


def delete_in_batches(
    sql: str,
    params: list,
    *,
    batch: int,
    max_batches: int,
    durable: bool = False,
    pace: float = 0.0,
    budget: float | None = None,
) -> int:
    """Run a bounded `DELETE` (its `LIMIT` is `batch`, its last parameter) until a batch is
    short or `max_batches` ran, each batch its own short transaction; return the rows deleted.

    The purges share it: a long purge never holds one big transaction, and a
    concurrent purge skips what this one holds (the statements say `SKIP LOCKED`).
    With `pace` > 0 it pauses after each full batch `pace` times as long as that
    batch took, so the purge uses at most 1 / (1 + pace) of one connection's time
    however fast or slow the database is; with a `budget` (seconds) it starts no
    batch once that much time has passed (docs/performance.md, "The key purge").
    """
    total = 0
    began = time.monotonic()
    for number in range(1, max_batches + 1):
        started = time.monotonic()
        if budget is not None and started - began >= budget:
            break
        with transaction.atomic(durable=durable), connection.cursor() as cursor:
            cursor.execute(sql, [*params, batch])
            deleted = cursor.rowcount
        total += deleted
        if deleted < batch:
            break
        if pace > 0 and number < max_batches:
            time.sleep(pace * (time.monotonic() - started))
    return total
