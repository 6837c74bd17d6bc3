"""A worker keeps its database pool from task to task (core/patches/celery_django.py).

A real prefork worker (two children, as a worker per CPU on two cores) runs
TASKS due chores; `pg_stat_database.sessions` counts the PostgreSQL
sessions opened on the test database meanwhile. The shop's worker opens a
constant few (each child's pool, once); the twin, the same app with Celery's
own Django fixup (`tests/support/upstream_fixup_celery.py`), opens about two
per task: its pool closed before and after each one.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection

from tests.support.models import DueChore
from tests.support.servers import celery_worker, server_env, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TASKS = 20
# Each pool child's first pool (one session, a second if a check found it dead), the
# main process's clock-offset reads: a constant, whatever the number of tasks.
KEPT_POOL_SESSIONS = 6
# A backend reports its counters at most once a second, and a session's end at once.
STATS_FLUSH = 2.0


def _sessions_opened() -> int:
    """Sessions opened on this database since its statistics began."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def _sessions_for_tasks(app: str, tmp_path) -> int:
    """Sessions a real worker of `app` opens while it runs TASKS chores, one at a time."""
    from config.celery import app as publisher

    chores = [DueChore.objects.create(label=f"chore {n}") for n in range(TASKS)]
    with celery_worker(env=server_env(), app=app, concurrency=2, log_dir=tmp_path) as worker:
        time.sleep(STATS_FLUSH)  # the children's start settled
        before = _sessions_opened()
        for chore in chores:
            publisher.send_task("testsupport.work_chore", args=[chore.pk])
            wait_until(
                lambda chore=chore: DueChore.objects.filter(
                    pk=chore.pk, done_at__isnull=False
                ).exists(),
                timeout=30,
                message=worker.log(),
            )
        time.sleep(STATS_FLUSH)
        return _sessions_opened() - before


def test_a_worker_opens_a_constant_number_of_sessions_whatever_its_tasks(tmp_path):
    assert _sessions_for_tasks("config", tmp_path) <= KEPT_POOL_SESSIONS


def test_twin_celerys_own_fixup_opens_sessions_per_task(tmp_path):
    assert _sessions_for_tasks("tests.support.upstream_fixup_celery:app", tmp_path) >= TASKS


def test_a_kept_session_the_server_ended_costs_the_next_task_nothing(tmp_path):
    """The pool checks a kept connection before handing it out: a database that ended the
    worker's sessions (a restart, a reset link) fails no task and retries none."""
    from config.celery import app as publisher

    name = "kept-pool-worker"
    first, second = (DueChore.objects.create(label=f"chore {n}") for n in range(2))
    env = server_env(PGAPPNAME=name)
    with celery_worker(env=env, concurrency=1, log_dir=tmp_path) as worker:
        for chore in (first, second):
            publisher.send_task("testsupport.work_chore", args=[chore.pk])
            wait_until(
                lambda chore=chore: DueChore.objects.filter(
                    pk=chore.pk, done_at__isnull=False
                ).exists(),
                timeout=30,
                message=worker.log(),
            )
            if chore is first:
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                        " WHERE application_name = %s",
                        [name],
                    )
                    assert cursor.fetchone()[0] >= 1  # the child's kept session, at least
    assert DueChore.objects.get(pk=second.pk).attempts == 1
