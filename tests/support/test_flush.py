"""The test-support `flush`: a deadlock with a live server's work is tried again."""

from __future__ import annotations

import re
import threading

import psycopg
import pytest
from django.core.management import call_command, get_commands
from django.core.management.base import CommandError
from django.core.management.commands.flush import Command as DjangoFlush
from django.core.management.sql import sql_flush
from django.db import connection

from tests.concurrency import wait_for_lock_waiters

pytestmark = pytest.mark.django_db(transaction=True)


def _truncated_tables() -> list[str]:
    (statement,) = sql_flush(DjangoFlush().style, connection, allow_cascade=False)
    return re.findall(r'"([^"]+)"', statement)


def _deadlock_the_flush(run_flush) -> BaseException | None:
    """Another session holds the TRUNCATE's last table, then wants its first: a deadlock.

    The flush waits first, so PostgreSQL's deadlock check (deadlock_timeout)
    fires in the flush's backend and fails the TRUNCATE; the other session then
    finishes, as a live worker's short transaction does.
    """
    tables = _truncated_tables()
    first, last = tables[0], tables[-1]
    params = connection.get_connection_params()
    holding = threading.Event()
    flush_waits = threading.Event()
    errors: list[BaseException] = []

    def worker() -> None:
        with psycopg.connect(**params) as other:
            with other.transaction():
                other.execute(f'LOCK TABLE "{last}" IN ROW EXCLUSIVE MODE')
                holding.set()
                flush_waits.wait(20)
                try:
                    other.execute(f'LOCK TABLE "{first}" IN ROW EXCLUSIVE MODE')
                except psycopg.errors.DeadlockDetected as exc:  # the other side chosen
                    errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert holding.wait(20)
        result: list[BaseException | None] = [None]

        def flush() -> None:
            try:
                run_flush()
            except BaseException as exc:  # noqa: BLE001 - returned to the test
                result[0] = exc
            finally:
                connection.close()  # this thread's own connection

        flusher = threading.Thread(target=flush)
        flusher.start()
        wait_for_lock_waiters(1)  # the TRUNCATE waits for the last table
        flush_waits.set()
        flusher.join(60)
    finally:
        flush_waits.set()
        thread.join(60)
    assert not errors, "PostgreSQL chose the worker's side, not the flush's"
    return result[0]


def test_the_tests_flush_is_the_support_apps():
    assert get_commands()["flush"] == "tests.support"


def test_a_flush_that_deadlocks_with_a_live_worker_is_tried_again():
    assert (
        _deadlock_the_flush(lambda: call_command("flush", interactive=False, verbosity=0)) is None
    )


def test_wrong_twin_djangos_own_flush_fails_on_the_same_deadlock():
    error = _deadlock_the_flush(lambda: call_command(DjangoFlush(), interactive=False, verbosity=0))
    assert isinstance(error, CommandError) and "couldn't be flushed" in str(error)
