"""Duplicate monitoring: every suppressed duplicate is logged and counted in the database.

A unique constraint that rejects legitimate data by mistake is as bad as a
duplicate, and only the counts show which is happening. So every mechanism
that suppresses a duplicate calls

    duplicate_suppressed(mechanism=INBOX_DUPLICATE, consumer=..., message_id=...)

which writes one structured log line (INFO; WARNING when `suspicious`: the
payload differed from the first one under the same id) and adds one to the
day's `DuplicateCount` row of that mechanism with ONE statement,
`INSERT ... ON CONFLICT (day, mechanism, suspicious) DO UPDATE SET count =
count + n`: concurrent gunicorn and Celery processes never lose a count.

Transactions: outside an application transaction the statement is its own
(autocommit) transaction. Inside one it runs right after that transaction
commits (`on_commit`), so the counter row's lock is never held across the
caller's work, and a duplicate met by work that then rolls back is not
counted: that work did not stand, and its retry meets the duplicate again
and is counted then. The log line is written at once either way. A count
that fails (database down) is logged and dropped, never raised.

`/metrics` reads the table: `shop_duplicates_suppressed_total{mechanism}` and
`shop_idempotency_key_conflicts_total{code}` (the key_in_use / key_reused rows).
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.models import Sum

from core.logging import key_hash

from .models import DuplicateCount

logger = logging.getLogger("shop.duplicates")

# The mechanisms (other areas call duplicate_suppressed with these).
KEY_REPLAY = "key_replay"  # a finished request key answered from its stored answer
KEY_IN_USE = "key_in_use"  # 409 idempotency_key_in_use: the same key still running
KEY_REUSED = "key_reused"  # 422 idempotency_key_reused: the key with another request
INBOX_DUPLICATE = "inbox_duplicate"  # a consumer's inbox already holds the message id
PROCESSED_ID = "processed_id"  # an id already recorded as processed (e.g. a provider event)
UNIQUE_CONSTRAINT = "unique_constraint"  # a unique constraint caught a second insert
WEBHOOK_DUPLICATE = "webhook_duplicate"  # a provider webhook delivered again
ON_READ_DEDUP = "on_read_dedup"  # duplicates dropped when reading (e.g. tracking events)

MECHANISMS = (
    KEY_REPLAY,
    KEY_IN_USE,
    KEY_REUSED,
    INBOX_DUPLICATE,
    PROCESSED_ID,
    UNIQUE_CONSTRAINT,
    WEBHOOK_DUPLICATE,
    ON_READ_DEDUP,
)

# shop_idempotency_key_conflicts_total{code}: the problem codes of two mechanisms.
CONFLICT_CODES = {KEY_IN_USE: "idempotency_key_in_use", KEY_REUSED: "idempotency_key_reused"}

_UPSERT = (
    f"INSERT INTO {DuplicateCount._meta.db_table} AS c (day, mechanism, suspicious, count) "
    "VALUES ((now() AT TIME ZONE 'UTC')::date, %s, %s, %s) "
    "ON CONFLICT (day, mechanism, suspicious) DO UPDATE SET count = c.count + EXCLUDED.count"
)


def _in_application_transaction() -> bool:
    """True inside an atomic block of the application (a test case's own block does not count).

    The same rule as Django's `atomic(durable=True)`: the wrapping
    transaction of a test is not the application's.
    """
    return connection.in_atomic_block and not all(
        getattr(block, "_from_testcase", False) for block in connection.atomic_blocks
    )


def _add(mechanism: str, suspicious: bool, amount: int) -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute(_UPSERT, [mechanism, suspicious, amount])
    except DatabaseError:
        logger.warning("duplicate not counted", extra={"mechanism": mechanism}, exc_info=True)


def duplicate_count(*, mechanism: str, suspicious: bool = False, amount: int = 1) -> None:
    """Add `amount` to today's count of `mechanism` (one upsert; see the module docstring)."""
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown duplicate mechanism {mechanism!r}")
    if _in_application_transaction():
        transaction.on_commit(lambda: _add(mechanism, suspicious, amount), robust=True)
    else:
        _add(mechanism, suspicious, amount)


def duplicate_suppressed(*, mechanism: str, suspicious: bool = False, **context: Any) -> None:
    """Log and count one suppressed duplicate of `mechanism` (one of MECHANISMS).

    `context` goes into the log line: ids that identify the duplicate (a
    consumer and message id, an order id, ...), never a secret. `key=` is
    logged as its hash, never as the key; None values are left out.
    `suspicious=True` when the duplicate's payload differs from the first one
    under the same id: counted apart and logged at WARNING.
    """
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown duplicate mechanism {mechanism!r}")
    context = {k: v for k, v in context.items() if v is not None}
    if "key" in context:
        context["idempotency_key_hash"] = key_hash(str(context.pop("key")))
    logger.log(
        logging.WARNING if suspicious else logging.INFO,
        "duplicate suppressed: %s%s",
        mechanism,
        " (payload differs)" if suspicious else "",
        extra={"event": "duplicate_suppressed", "mechanism": mechanism, "suspicious": suspicious}
        | {f"ctx_{k}" if k in _RESERVED else k: v for k, v in context.items()},
    )
    duplicate_count(mechanism=mechanism, suspicious=suspicious)


# LogRecord attributes a context field must not overwrite (logging raises on them).
_RESERVED = frozenset(vars(logging.LogRecord("x", logging.INFO, "x", 0, "", None, None)).keys()) | {
    "message",
    "asctime",
    "event",
    "mechanism",
    "suspicious",
}


# --- Reading ------------------------------------------------------------------


def duplicate_totals() -> dict[str, int]:
    """Return {mechanism: all-time count} for every mechanism (0 for those never seen)."""
    totals = dict.fromkeys(MECHANISMS, 0)
    for row in DuplicateCount.objects.values("mechanism").annotate(n=Sum("count")):
        totals[row["mechanism"]] = int(row["n"] or 0)
    return totals


def suspicious_totals() -> dict[str, int]:
    """Return {mechanism: all-time count of suspicious duplicates}."""
    totals = dict.fromkeys(MECHANISMS, 0)
    rows = DuplicateCount.objects.filter(suspicious=True).values("mechanism")
    for row in rows.annotate(n=Sum("count")):
        totals[row["mechanism"]] = int(row["n"] or 0)
    return totals


def conflict_totals() -> dict[str, int]:
    """Return {problem code: count} for shop_idempotency_key_conflicts_total."""
    totals = duplicate_totals()
    return {code: totals[mechanism] for mechanism, code in CONFLICT_CODES.items()}


# --- Compatibility -------------------------------------------------------------

_OLD_MECHANISMS = {"request_key": KEY_REPLAY, "inbox": INBOX_DUPLICATE}
_OLD_CODES = {code: mechanism for mechanism, code in CONFLICT_CODES.items()}


def count(name: str, amount: int = 1, **labels: object) -> None:
    """Deprecated (the former Redis counters): map the two old names onto duplicate_count.

    Kept so that a branch still calling `metrics.count(...)` merges and
    counts; new code calls duplicate_suppressed.
    """
    if name == "shop_duplicates_suppressed_total":
        mechanism = str(labels.get("mechanism"))
        mechanism = _OLD_MECHANISMS.get(mechanism, mechanism)
    elif name == "shop_idempotency_key_conflicts_total":
        mechanism = _OLD_CODES[str(labels.get("code"))]
    else:
        raise ValueError(f"unknown counter {name!r}")
    duplicate_count(mechanism=mechanism, amount=amount)
