"""A Celery worker keeps its database pool from task to task.

Upstream: celery 5.7.0. Subclasses `celery.fixups.django.DjangoWorkerFixup`,
overriding `close_database` (what its `on_task_prerun` and
`on_task_postrun` call) and keeping `on_worker_process_init`, which calls
the private `_close_database`; subclasses `DjangoFixup`, overriding its
`worker_fixup` property; copies the module's `fixup` (the entry Celery's
`fixups` argument names, config/celery.py) to build the subclass.

Celery's Django fixup closes every database connection before and after
each task, and in a prefork child closes its pool as well
(`_close_database`: `conn.close()`, then `conn.close_pool()`). With the
psycopg pool on (`DB_POOL`, config/settings/servers.py) every task then
builds a new pool, which opens two PostgreSQL sessions: its `min_size` one
in the background, and one more it grows for the task's first query, which
does not wait for the first: two new backends (fork, authentication,
catalogue caches) per task, several per order (docs/performance.md,
"Database sessions of the workers").

Here each task's connection goes back to the pool instead (Django's
`close()` on a pooled connection: the pool rolls back an open transaction
and drops a broken connection) and the pool stays: a prefork child keeps
one warm session. The pool's own bounds stay as configured: its
`CONN_HEALTH_CHECKS` check before a connection is handed out (a restarted
database costs no task a dead connection), its `max_idle` and
`max_lifetime`. A new child still closes the pool it may have inherited
from its parent (upstream's `on_worker_process_init`, unchanged), so no
connection crosses a fork.

This module imports no project app.
"""

from __future__ import annotations

import os
from typing import Any

# celery-types stubs DjangoFixup only, not DjangoWorkerFixup.
from celery.fixups.django import DjangoFixup, DjangoWorkerFixup  # type: ignore[attr-defined]


class PoolKeepingWorkerFixup(DjangoWorkerFixup):
    """Celery's worker fixup, minus closing the pool around each task."""

    def close_database(self, **kwargs: Any) -> None:
        """Hand each open connection back to its pool (close it when it has none)."""
        for conn in self._db.connections.all(initialized_only=True):
            try:
                conn.close()
            except self.interface_errors:
                pass
            except self.DatabaseError as exc:
                # Upstream's own tolerance: a connection already closed is no error.
                if "closed" not in str(exc) and "not connected" not in str(exc):
                    raise


class PoolKeepingDjangoFixup(DjangoFixup):
    """Celery's Django fixup whose worker half is a `PoolKeepingWorkerFixup`."""

    _worker_fixup: DjangoWorkerFixup | None  # set by DjangoFixup.__init__ (not in the stubs)

    @property
    def worker_fixup(self) -> DjangoWorkerFixup:
        if self._worker_fixup is None:
            self._worker_fixup = PoolKeepingWorkerFixup(self.app)
        return self._worker_fixup

    @worker_fixup.setter
    def worker_fixup(self, value: DjangoWorkerFixup) -> None:
        self._worker_fixup = value


def fixup(app: Any, env: str = "DJANGO_SETTINGS_MODULE") -> DjangoFixup | None:
    """Install the fixup when the process has Django settings, as Celery's own `fixup` does."""
    if os.environ.get(env) and "django" not in app.loader_cls.lower():
        installed = PoolKeepingDjangoFixup(app)
        installed.install()  # returns the fixup itself; the stubs say None
        return installed
    return None
