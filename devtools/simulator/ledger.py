"""The simulated provider's own ledger: a SQLite file that outlives the process.

It stands for an external system, so it shares nothing with the shop (no
Django, no PostgreSQL). Every operation is stored under the caller's
idempotency key together with a fingerprint of its parameters; the money
movement and the operation row are one SQLite transaction, so a process
killed at any instant leaves either both or neither.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import sqlite3
import threading
import uuid
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import cast

from babel.numbers import get_currency_precision, is_currency

SCHEMA = """
CREATE TABLE IF NOT EXISTS operations (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    key TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status TEXT NOT NULL,
    amount TEXT NOT NULL,
    currency TEXT NOT NULL,
    payment_method TEXT,
    reference TEXT,
    parent_key TEXT,
    decline_code TEXT,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS operations_parent ON operations (parent_key);
CREATE TABLE IF NOT EXISTS attempts (
    key TEXT PRIMARY KEY,
    count INTEGER NOT NULL
);
-- Webhook events written with their operation (an outbox), delivered at least
-- once by the sender thread (webhooks.py): `sends_left` sends are still owed
-- (2 when the event is duplicated), the next one at `next_attempt_at` (unix
-- seconds; 0 = now); `attempts` counts failed sends (for the backoff).
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    type TEXT NOT NULL,
    operation_key TEXT NOT NULL,
    payload TEXT NOT NULL,
    created_at TEXT NOT NULL,
    delivered_at TEXT,
    deliveries INTEGER NOT NULL DEFAULT 0,
    sends_left INTEGER NOT NULL DEFAULT 1,
    next_attempt_at REAL NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT
);
"""
# Columns added to `events` after ledgers were first written (ALTER on open).
EVENT_COLUMNS = {
    "sends_left": "INTEGER NOT NULL DEFAULT 1",
    "next_attempt_at": "REAL NOT NULL DEFAULT 0",
    "attempts": "INTEGER NOT NULL DEFAULT 0",
    "last_error": "TEXT",
}

KINDS = ("authorize", "capture", "void", "refund")

EVENT_TYPES = {
    ("capture", "succeeded"): "charge.captured",
    ("capture", "declined"): "charge.failed",
    ("authorize", "declined"): "charge.failed",
    ("refund", "succeeded"): "refund.succeeded",
    ("refund", "declined"): "refund.failed",
}


class RequestError(Exception):
    """A request the provider refuses without storing anything (HTTP 4xx)."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


def now_text() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_amount(value, currency: str) -> Decimal:
    """Parse a positive decimal string with at most the currency's minor units."""
    if not isinstance(value, str):
        raise RequestError(400, "invalid_amount", "amount must be a decimal string")
    try:
        amount = Decimal(value)
    except InvalidOperation as exc:
        raise RequestError(400, "invalid_amount", f"not an amount: {value!r}") from exc
    if not is_currency(currency):  # minor units are CLDR's, as in core.money
        raise RequestError(400, "invalid_currency", f"not an ISO 4217 currency: {currency!r}")
    places = get_currency_precision(currency)
    if not amount.is_finite() or amount <= 0 or -cast(int, amount.as_tuple().exponent) > places:
        raise RequestError(400, "invalid_amount", f"amount must be > 0 with <= {places} places")
    return amount.quantize(Decimal(1).scaleb(-places))


def fingerprint(kind: str, params: dict) -> str:
    """Hash the parameters that decide an operation; a reused key must match them."""
    canonical = json.dumps({"kind": kind, **params}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class Ledger:
    """Operations keyed by idempotency key, in a SQLite file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()
        conn = self._conn()
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(SCHEMA)
        have = {row["name"] for row in conn.execute("PRAGMA table_info(events)")}
        for column, definition in EVENT_COLUMNS.items():
            if column not in have:
                conn.execute(f"ALTER TABLE events ADD COLUMN {column} {definition}")
        conn.execute(
            "CREATE INDEX IF NOT EXISTS events_due ON events (next_attempt_at) WHERE sends_left > 0"
        )

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            conn.row_factory = sqlite3.Row
            # A committed operation must survive a SIGKILL of this process: in WAL
            # mode NORMAL guarantees that (the commit is in the WAL file, in the
            # OS's page cache); only a power loss of the machine could lose the
            # last commits, which a simulated provider need not survive. FULL
            # would add an fsync per operation to every capture's latency.
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    # -- reads ---------------------------------------------------------------

    def get(self, key: str) -> dict | None:
        row = self._conn().execute("SELECT * FROM operations WHERE key = ?", (key,)).fetchone()
        return _op(row) if row else None

    def list(self, *, key_prefix: str = "", after: int = 0, limit: int = 500) -> list[dict]:
        rows = self._conn().execute(
            "SELECT * FROM operations WHERE seq > ? AND substr(key, 1, ?) = ? ORDER BY seq LIMIT ?",
            (after, len(key_prefix), key_prefix, limit),
        )
        return [_op(row) for row in rows]

    def counts(self) -> dict:
        conn = self._conn()
        ops = conn.execute(
            "SELECT kind, status, COUNT(*) AS n FROM operations GROUP BY kind, status"
        ).fetchall()
        events = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        undelivered = conn.execute(
            "SELECT COUNT(*) FROM events WHERE sends_left > 0 AND delivered_at IS NULL"
        ).fetchone()[0]
        return {
            "operations": {f"{row['kind']}.{row['status']}": row["n"] for row in ops},
            "events": events,
            "events_undelivered": undelivered,
        }

    # -- webhook events (the sender's queue) ----------------------------------

    # `builtins.list`: the method `list` above shadows the name in this class.
    def events_due(self, *, now: float, limit: int = 20) -> builtins.list[dict]:
        rows = self._conn().execute(
            "SELECT * FROM events WHERE sends_left > 0 AND next_attempt_at <= ? "
            "ORDER BY next_attempt_at, seq LIMIT ?",
            (now, limit),
        )
        return [dict(row) for row in rows]

    def events_list(self, *, operation_key: str | None = None) -> builtins.list[dict]:
        sql = "SELECT * FROM events"
        params: tuple[str, ...] = ()
        if operation_key is not None:
            sql, params = sql + " WHERE operation_key = ?", (operation_key,)
        return [dict(row) for row in self._conn().execute(sql + " ORDER BY seq", params)]

    def event_schedule(self, *, operation_key: str, sends: int, next_attempt_at: float) -> None:
        """Decide how often and when a fresh event is sent (not once sending began)."""
        self._conn().execute(
            "UPDATE events SET sends_left = ?, next_attempt_at = ? "
            "WHERE operation_key = ? AND deliveries = 0 AND attempts = 0",
            (sends, next_attempt_at, operation_key),
        )

    def event_delivered(self, *, event_id: str, next_attempt_at: float) -> None:
        self._conn().execute(
            "UPDATE events SET deliveries = deliveries + 1, sends_left = sends_left - 1, "
            "delivered_at = COALESCE(delivered_at, ?), next_attempt_at = ?, last_error = NULL "
            "WHERE id = ? AND sends_left > 0",
            (now_text(), next_attempt_at, event_id),
        )

    def event_failed(self, *, event_id: str, next_attempt_at: float, error: str) -> None:
        self._conn().execute(
            "UPDATE events SET attempts = attempts + 1, next_attempt_at = ?, last_error = ? "
            "WHERE id = ?",
            (next_attempt_at, error[:500], event_id),
        )

    # -- writes --------------------------------------------------------------

    def count_attempt(self, key: str) -> int:
        """Count one attempt for a key (durably) and return the new count."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "INSERT INTO attempts (key, count) VALUES (?, 1) "
                "ON CONFLICT (key) DO UPDATE SET count = count + 1",
                (key,),
            )
            count = conn.execute("SELECT count FROM attempts WHERE key = ?", (key,)).fetchone()[0]
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return count

    def apply(
        self,
        *,
        key: str,
        kind: str,
        fp: str,
        status: str,
        amount: Decimal | None,
        currency: str | None,
        payment_method: str | None,
        reference: str | None,
        parent_key: str | None,
        decline_code: str | None = None,
    ) -> tuple[dict, bool]:
        """Store one operation (and its event) atomically; return it and whether it is new.

        Checks that depend on earlier operations (what an authorization still
        holds, what a capture can still refund) run inside the same
        transaction, so two different keys cannot both spend the same money.
        """
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            existing = conn.execute("SELECT * FROM operations WHERE key = ?", (key,)).fetchone()
            if existing is not None:
                conn.execute("ROLLBACK")
                return _op(existing), False
            if status == "succeeded" and parent_key is not None:
                amount, currency = self._check_parent(
                    conn, kind=kind, parent_key=parent_key, amount=amount, currency=currency
                )
            op_id = "op_" + uuid.uuid4().hex
            created = now_text()
            conn.execute(
                "INSERT INTO operations (id, key, kind, fingerprint, status, amount, currency, "
                "payment_method, reference, parent_key, decline_code, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    op_id,
                    key,
                    kind,
                    fp,
                    status,
                    str(amount),
                    currency,
                    payment_method,
                    reference,
                    parent_key,
                    decline_code,
                    created,
                ),
            )
            event_type = EVENT_TYPES.get((kind, status))
            if event_type:
                payload = {
                    "provider_key": key,
                    "reference": reference,
                    "amount": str(amount),
                    "currency": currency,
                    "operation_id": op_id,
                }
                conn.execute(
                    "INSERT INTO events (id, type, operation_key, payload, created_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    ("evt_" + uuid.uuid4().hex, event_type, key, json.dumps(payload), created),
                )
            row = conn.execute("SELECT * FROM operations WHERE key = ?", (key,)).fetchone()
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return _op(row), True

    def _check_parent(
        self,
        conn: sqlite3.Connection,
        *,
        kind: str,
        parent_key: str,
        amount: Decimal | None,
        currency: str | None,
    ) -> tuple[Decimal, str]:
        parent = conn.execute("SELECT * FROM operations WHERE key = ?", (parent_key,)).fetchone()
        wanted_parent = {"capture": "authorize", "void": "authorize", "refund": "capture"}[kind]
        if parent is None or parent["kind"] != wanted_parent or parent["status"] != "succeeded":
            raise RequestError(
                400, "invalid_parent", f"no succeeded {wanted_parent} with key {parent_key!r}"
            )
        if currency is not None and currency != parent["currency"]:
            raise RequestError(400, "currency_mismatch", "currency differs from the original")
        children = conn.execute(
            "SELECT kind, amount FROM operations WHERE parent_key = ? AND status = 'succeeded'",
            (parent_key,),
        ).fetchall()
        spent = sum((Decimal(c["amount"]) for c in children), Decimal(0))
        if kind in ("capture", "void") and any(c["kind"] == "void" for c in children):
            raise RequestError(400, "authorization_voided", "the authorization was voided")
        remaining = Decimal(parent["amount"]) - spent
        if kind == "void":
            if remaining <= 0:
                raise RequestError(400, "nothing_to_void", "the authorization is fully captured")
            return remaining, parent["currency"]
        assert amount is not None  # only a void comes without an amount (server.py)
        if amount > remaining:
            code = "amount_exceeds_capture" if kind == "refund" else "amount_exceeds_authorization"
            raise RequestError(400, code, f"at most {remaining} remains")
        return amount, parent["currency"]


def _op(row: sqlite3.Row) -> dict:
    return {
        "seq": row["seq"],
        "id": row["id"],
        "key": row["key"],
        "kind": row["kind"],
        "fingerprint": row["fingerprint"],
        "status": row["status"],
        "amount": row["amount"],
        "currency": row["currency"],
        "payment_method": row["payment_method"],
        "reference": row["reference"],
        "parent_key": row["parent_key"],
        "decline_code": row["decline_code"],
        "created_at": row["created_at"],
    }
