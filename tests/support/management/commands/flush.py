"""Django's `flush`, tried again when a live server's own work deadlocks with it.

A transactional test (every browser test, every test beside a live gunicorn
and Celery worker) ends with `flush`: one TRUNCATE of every table, which takes
each table's ACCESS EXCLUSIVE lock in turn. The live worker may still be
finishing what the test started (a return's refund, a beat sweep) and hold
one of those tables while it waits for another: PostgreSQL ends the deadlock
by failing one side, and when that side is the TRUNCATE, Django's flush
raises and the test errors at teardown (seen in CI: TRUNCATE against a
`payments_paymentevent` insert of a return's refund). The worker's
transaction is short, so the flush is tried again a few times; anything else
raises at once. Test support only: the shop's own `flush` is Django's.
"""

from __future__ import annotations

import time

from django.core.management.base import CommandError
from django.core.management.commands.flush import Command as DjangoFlush

# SQLSTATEs that mean "another transaction was in the way", not a broken flush.
RETRYABLE = {"40P01", "55P03"}  # deadlock_detected, lock_not_available
ATTEMPTS = 5


class Command(DjangoFlush):
    def handle(self, **options):
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return super().handle(**options)
            except CommandError as exc:
                if _sqlstate(exc) not in RETRYABLE or attempt == ATTEMPTS:
                    raise
                time.sleep(0.2 * attempt)


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of the psycopg error under Django's wrappers, if any."""
    while exc is not None:
        if getattr(exc, "sqlstate", None):
            return exc.sqlstate
        exc = exc.__cause__
    return None
