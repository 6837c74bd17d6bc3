"""Helpers for race tests: threads with their own connections, and proof that they overlapped.

A race test releases its threads with a barrier right before the contested
step and then proves the overlap happened by observing waiters in
PostgreSQL (`pg_stat_activity.wait_event_type = 'Lock'`), instead of
sleeping and hoping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connection, connections

from tests.support import servers as testing


def lock_waiters() -> int:
    """Count this database's backends waiting for a lock right now."""
    with connections["default"].cursor() as cursor:
        # Inside a transaction pg_stat_activity is a snapshot taken at first
        # use; clear it so each poll sees the present.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


def _activity() -> list[tuple]:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT pid, datname, state, wait_event_type, wait_event, left(query, 60) "
            "FROM pg_stat_activity WHERE datname = current_database()"
        )
        return cursor.fetchall()


def wait_until(predicate: Callable[[], Any], *, timeout: float = 20.0, what: str = "") -> Any:
    """Poll `predicate` until it returns something truthy; fail with the database's activity."""
    try:
        return testing.wait_until(
            predicate, timeout=timeout, interval=0.01, message=what or repr(predicate)
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {_activity()}") from None


def wait_for_lock_waiters(count: int, *, timeout: float = 20.0) -> int:
    """Wait until at least `count` backends wait for a lock; return how many do."""
    return wait_until(
        lambda: (lambda n: n if n >= count else 0)(lock_waiters()),
        timeout=timeout,
        what=f"{count} lock waiters",
    )


class Workers:
    """Run callables in threads, each with its own database connection; collect results."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.results: list[Any] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()

    def start(self, target: Callable[..., Any], *args: Any, **kwargs: Any) -> threading.Thread:
        def run() -> None:
            try:
                result = target(*args, **kwargs)
                with self._lock:
                    self.results.append(result)
            except BaseException as exc:  # noqa: BLE001 - reported by join()
                with self._lock:
                    self.errors.append(exc)
            finally:
                connection.close()

        thread = threading.Thread(target=run, daemon=True)
        self.threads.append(thread)
        thread.start()
        return thread

    def join(self, *, timeout: float = 120.0) -> list[Any]:
        """Wait for every thread; re-raise the first error; return the results."""
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            assert not thread.is_alive(), "a worker thread did not finish"
        if self.errors:
            raise self.errors[0]
        return self.results
