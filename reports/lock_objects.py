"""Every lock the reports app takes, in one place.

A report step for a day runs under a transaction-scoped advisory lock of
that day: two runs for the same day (beat and a staff's command, a
redelivered task) take turns step by step instead of interleaving their
delete-and-rewrite (two extracts at once would each delete nothing the
other had not committed yet and both insert).
"""

from __future__ import annotations

import zlib
from datetime import date

from django.db import connection

_NAMESPACE = zlib.crc32(b"reports.daily_sales") & 0x7FFFFFFF


def report_day_lock(*, day: date) -> None:
    """Wait for and hold the day's report lock until the transaction ends."""
    assert connection.in_atomic_block, "an xact advisory lock outside a transaction is released"
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_NAMESPACE, day.toordinal()])
