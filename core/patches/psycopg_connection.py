"""psycopg's connection, each wait on its socket bounded by the web request's deadline.

Upstream: psycopg 3.3.9. Overrides `psycopg.Connection.wait` (calls it with
the time left as its `timeout`) and catches its private
`psycopg.errors._WaitTimeout`, which that `wait` raises when the timeout
passes.

The pool's connection class (`DATABASES["default"]["OPTIONS"]["pool"]`,
config/settings/servers.py). A statement on a database that accepted it and
then stopped answering has no other bound (core/deadline.py): when the
request's deadline passes mid-wait the connection is closed (its protocol
state is unknown mid-statement, so it is never used again) and the wait
raises `DeadlineExceeded`, an `OperationalError`, which every request turns
into 503 `service_unavailable` (core/problems.py).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg import errors

from core.deadline import current_deadline


class DeadlineExceeded(psycopg.OperationalError):
    """The request's deadline passed while it waited on the database."""


class DeadlineConnection(psycopg.Connection):
    """psycopg's connection, each wait on its socket bounded by the thread's deadline."""

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        deadline = current_deadline()
        if deadline is None:
            return super().wait(gen, interval, timeout)
        left = max(deadline - time.monotonic(), 0.0)
        if timeout is not None and timeout <= left:
            return super().wait(gen, interval, timeout)  # the caller's own bound comes first
        try:
            return super().wait(gen, interval, left)
        except errors._WaitTimeout as exc:
            # Mid-statement: what the server did or will do with it is unknown, so the
            # connection ends here (the pool drops a closed connection).
            self.pgconn.finish()
            raise DeadlineExceeded(
                "the request's deadline passed while it waited on the database"
            ) from exc
