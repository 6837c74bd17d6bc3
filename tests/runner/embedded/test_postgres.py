"""The embedded PostgreSQL: start, stop, reuse, and recovery from what a dead start left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psycopg
import pytest

from runner.embedded.postgres import EmbeddedPostgres
from runner.processes import ServerBusy
from tests.runner.conftest import leftovers, sockets_under, start_and_lose, wait_for

pytestmark = pytest.mark.embedded


def _server(root) -> EmbeddedPostgres:
    return EmbeddedPostgres(data_dir=root / "data" / "postgres", socket_dir=root / "run" / "pg")


def _query(url: str, sql: str, *params):
    with psycopg.connect(url.replace("postgres://", "postgresql://"), autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else None


def test_start_creates_database_stop_leaves_nothing_second_start_reuses(short_tmp):
    server = _server(short_tmp)
    url = server.start()
    assert url == f"postgres://postgres@/shop?host={short_tmp}/run/pg"
    _query(url, "CREATE TABLE kept (v text)")
    _query(url, "INSERT INTO kept VALUES ('first run')")
    created = (server.data_dir / "PG_VERSION").stat().st_mtime_ns

    server.stop()

    assert not server.running()
    assert leftovers(under=short_tmp) == []
    assert sockets_under(short_tmp) == []
    assert not (server.data_dir / "postmaster.pid").exists()

    again = _server(short_tmp)
    url = again.start()
    try:
        assert _query(url, "SELECT v FROM kept") == [("first run",)]
        assert (again.data_dir / "PG_VERSION").stat().st_mtime_ns == created  # no new initdb
        assert _query(url, "SHOW listen_addresses") == [("",)]  # Unix socket only
    finally:
        again.stop()


def test_a_second_starter_is_refused_while_the_first_runs(short_tmp):
    first = _server(short_tmp)
    first.start()
    try:
        with pytest.raises(ServerBusy):
            _server(short_tmp).start()
        assert first.running()
    finally:
        first.stop()


def test_start_recovers_stale_pid_and_socket_files_after_a_killed_server(short_tmp):
    server = _server(short_tmp)
    url = server.start()
    _query(url, "CREATE TABLE kept (v text)")
    _query(url, "INSERT INTO kept VALUES ('before the crash')")
    os.killpg(server.pid, signal.SIGKILL)
    server.stop()
    pid_file = server.data_dir / "postmaster.pid"
    socket_lock = server.socket_dir / ".s.PGSQL.5432.lock"
    assert pid_file.exists() and socket_lock.exists()
    # The stale files name a pid that is alive again, reused by another
    # process of the server's user: PostgreSQL alone would refuse to start.
    squatter = subprocess.Popen(["sleep", "600"], **server._as_service_user())
    try:
        for stale in (pid_file, socket_lock):
            lines = stale.read_text().split("\n")
            stale.write_text("\n".join([str(squatter.pid), *lines[1:]]))

        again = _server(short_tmp)
        url = again.start()
        try:
            assert _query(url, "SELECT v FROM kept") == [("before the crash",)]
        finally:
            again.stop()
    finally:
        squatter.kill()
        squatter.wait()
    assert leftovers(under=short_tmp) == []


def test_start_stops_a_leftover_server_whose_starter_lost_it(short_tmp):
    code = (
        "from pathlib import Path\n"
        "from runner.embedded.postgres import EmbeddedPostgres\n"
        f"root = Path({str(short_tmp)!r})\n"
        "server = EmbeddedPostgres(\n"
        "    data_dir=root / 'data' / 'postgres', socket_dir=root / 'run' / 'pg'\n"
        ")\n"
        "server.start()"
    )
    holder = start_and_lose(code)
    try:
        old_pid = int((short_tmp / "data/postgres/postmaster.pid").read_text().split()[0])

        server = _server(short_tmp)
        url = server.start()
        try:
            assert server.pid != old_pid
            assert _query(url, "SELECT 1") == [(1,)]
        finally:
            server.stop()
    finally:
        holder.kill()
        holder.wait()
    assert leftovers(under=short_tmp) == []


def test_server_dies_with_the_process_that_started_it(short_tmp):
    code = (
        "from pathlib import Path\n"
        "from runner.embedded.postgres import EmbeddedPostgres\n"
        f"root = Path({str(short_tmp)!r})\n"
        "EmbeddedPostgres(data_dir=root / 'data' / 'postgres', socket_dir=root / 'run' / 'pg')"
        ".start()\n"
        "import os, signal; print('ready', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    )
    starter = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert starter.stdout.strip() == "ready", starter.stderr
    assert starter.returncode == -signal.SIGKILL

    wait_for(
        lambda: not leftovers(under=short_tmp),
        timeout=30,
        message="postgres outlived its killed starter",
    )
    assert sockets_under(short_tmp) == []
