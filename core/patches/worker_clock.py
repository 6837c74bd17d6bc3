"""A worker judges a message's ETA by the database clock, not by its host's.

Upstream: celery 5.7.0. Overrides the `eta` property of
`celery.worker.request.Request`, reading the private slot `_eta` its
`__init__` sets; the consumer decides when a message is due by that property.

Every ETA this shop sends is a database-clock time (`core.due.ring(delay=)`,
`core.due.retry_eta`). Celery's worker holds a message with an ETA until its
own host's clock reaches it, so a worker on a host *behind* the database
clock would hold every such message that much longer (docs/failure-model.md,
"What broke, and what fixed it": a host behind the database clock). A host
ahead runs them early, which the row refuses until it is due: safe as it is.

`DatabaseClockRequest` is every task's request class (config/celery.py):
its `eta` is the message's database-clock ETA moved onto this host's clock by
the offset this process last read. The consumer that decides runs in the
worker's main process, which runs no task and so never reads the database
clock on its own: `start_offset_reader` reads it there once at the worker's
start and then every OFFSET_READ_INTERVAL seconds, on a thread of its own,
so that a hung database never holds the consumer. Until the first read the
offset is 0 (Celery's own behaviour).

This module imports no other project app; of core, only its database clock.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

from celery import Task
from celery.worker.request import Request

from core.db import clock_offset, database_now

OFFSET_READ_INTERVAL = 60.0  # seconds; a host's clock drifts slowly, a skew is constant

_reader_started = threading.Event()


class DatabaseClockRequest(Request):
    """A task request whose ETA is read by the database clock (module docstring)."""

    __slots__ = ()

    @property
    def eta(self) -> datetime | None:
        eta = self._eta  # type: ignore[attr-defined]  # Celery sets it in __init__ (slots)
        if eta is None:
            return None
        # offset = this host's clock - the database's: the same instant on this host.
        return eta + timedelta(seconds=clock_offset())


class DatabaseClockTask(Task):
    """The base of every task: its worker judges ETAs by the database clock."""

    Request = f"{DatabaseClockRequest.__module__}:{DatabaseClockRequest.__qualname__}"


def read_offset_once() -> bool:
    """Read the database clock once (noting this process's offset); False if it failed."""
    from django.db import connection

    try:
        database_now()
        return True
    except Exception:  # noqa: BLE001 - best effort: the last offset stays
        return False
    finally:
        connection.close()  # this thread's own connection, never left open between reads


def start_offset_reader() -> None:
    """Read the offset now and every OFFSET_READ_INTERVAL s, on a thread (once per process)."""
    if _reader_started.is_set():
        return
    _reader_started.set()

    def loop() -> None:
        while True:  # a daemon thread: it ends with the process
            read_offset_once()
            time.sleep(OFFSET_READ_INTERVAL)

    threading.Thread(target=loop, name="database-clock-offset", daemon=True).start()
