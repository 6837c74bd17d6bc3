"""The setup lock: one host at a time runs the setup steps on a shared database.

Two supervisors started together on one PostgreSQL (two hosts, docs/deployment.md)
would otherwise run `migrate` at the same time, and Django's migrations are
not safe to run concurrently (both create the same table; one fails, or both
record the same migration). The supervisor holds a PostgreSQL session-level
advisory lock around its setup steps; a second host waits for it and then
finds nothing left to migrate or seed. The lock belongs to the supervisor's
own connection, so a supervisor that dies, however it dies, releases it with
its connection.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import psycopg

# pg_advisory_lock's key: "shop" in ASCII, one key for every checkout on this database.
SETUP_LOCK_KEY = 0x73686F70
POLL = 0.5
PROGRESS_EVERY = 10.0


def _try_lock(conn: psycopg.Connection) -> bool:
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (SETUP_LOCK_KEY,)).fetchone()
    return bool(row and row[0])


@contextlib.contextmanager
def setup_lock(
    database_url: str,
    *,
    check: Callable[[], None] = lambda: None,
    say: Callable[[str], None] = lambda message: None,
) -> Iterator[None]:
    """Hold the setup lock of `database_url` for the body; wait (saying so) while it is taken.

    `check` is called while waiting and may raise to give up (a stop signal).
    """
    conn = psycopg.connect(database_url, autocommit=True, connect_timeout=10)
    try:
        started = time.monotonic()
        told = 0.0
        while not _try_lock(conn):
            waited = time.monotonic() - started
            if told == 0.0 or waited - told >= PROGRESS_EVERY:
                say(f"waiting for the setup lock: another host is running setup ({waited:.0f} s)")
                told = max(waited, 1e-9)
            check()
            time.sleep(POLL)
        yield
    finally:
        # Closing the session releases the lock (and does so for a killed holder too).
        conn.close()
