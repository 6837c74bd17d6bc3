"""The release step migrates one host at a time (docs/deployment.md, "The release step").

`manage.py release` runs `migrate` under a PostgreSQL session advisory lock. Each test
runs it as a subprocess on a fresh database of the test server, as the release unit of
a host would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from core.management.commands.release import RELEASE_LOCK_KEY
from runner.setup_lock import SETUP_LOCK_KEY

ROOT = Path(__file__).resolve().parents[2]
WAITING = "waiting for the release lock"


def _url(dbname: str | None = None) -> str:
    url = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(url._replace(path=f"/{dbname}")) if dbname else url.geturl()


@pytest.fixture
def fresh_database() -> Iterator[str]:
    """The URL of a new, empty database on the test server, dropped afterwards."""
    dbname = f"release_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(_url(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
    try:
        yield _url(dbname)
    finally:
        with psycopg.connect(_url(), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def _start(command: str, url: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.base",
        DATABASE_URL=url,
        DB_POOL="false",
        SHOP_ENV_FILE=os.devnull,
    )
    return subprocess.Popen(
        [sys.executable, "manage.py", command, "--noinput" if command == "migrate" else "-v1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _applied(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        exists = conn.execute("SELECT to_regclass('django_migrations')").fetchone()[0]
        if exists is None:
            return []
        return conn.execute("SELECT app, name FROM django_migrations").fetchall()


def test_the_release_lock_is_the_supervisors_setup_lock():
    """One key: a supervisor's setup and a release unit never migrate together."""
    assert RELEASE_LOCK_KEY == SETUP_LOCK_KEY


@pytest.mark.slow
def test_a_release_waits_while_another_holds_the_lock_and_a_bare_migrate_does_not(
    fresh_database,
):
    """While the lock is held (another host's release) `release` waits and migrates nothing;
    once it is free it migrates. A bare `migrate`, the wrong twin, does not wait."""
    with psycopg.connect(fresh_database, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (RELEASE_LOCK_KEY,))
        release = _start("release", fresh_database)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and release.poll() is None:
            waiting = holder.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).fetchone()[0]
            if waiting:
                break
            time.sleep(0.2)
        assert release.poll() is None, release.communicate()
        time.sleep(1.0)
        assert release.poll() is None and _applied(fresh_database) == []
        twin = _start("migrate", fresh_database)
        assert twin.wait(240) == 0, twin.communicate()[1]  # migrates under another's lock
        holder.execute("SELECT pg_advisory_unlock(%s)", (RELEASE_LOCK_KEY,))
        out, err = release.communicate(timeout=240)
    assert release.returncode == 0, err
    assert WAITING in err
    assert "No migrations to apply" in out


@pytest.mark.slow
def test_two_releases_at_once_migrate_one_database_once(fresh_database):
    """Two hosts' release steps started at one moment on an empty database: one migrates
    while the other waits, then finds nothing to apply; each migration is recorded once."""
    barrier = threading.Barrier(2)
    results: list[tuple[int, str, str]] = []

    def host() -> None:
        barrier.wait()
        proc = _start("release", fresh_database)
        out, err = proc.communicate(timeout=300)
        results.append((proc.returncode, out, err))

    threads = [threading.Thread(target=host) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(320)
    assert [code for code, _, _ in results] == [0, 0], [err for _, _, err in results]
    applied = _applied(fresh_database)
    assert applied and len(applied) == len(set(applied))
    assert sum("No migrations to apply" in out for _, out, _ in results) == 1
