"""The embedded Redis: start, stop, reuse of the append-only file, recovery."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import redis

from runner.embedded.redis import EmbeddedRedis
from runner.processes import ServerBusy
from tests.runner.conftest import leftovers, start_and_lose, wait_for

pytestmark = pytest.mark.embedded


def _server(root, *, appendonly: bool = True) -> EmbeddedRedis:
    return EmbeddedRedis(
        data_dir=root / "data" / "redis", run_dir=root / "run", appendonly=appendonly
    )


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=2)


def test_start_stop_and_a_second_start_keeps_queued_data(short_tmp):
    server = _server(short_tmp)
    url = server.start()
    assert url.startswith("redis://127.0.0.1:")
    # What a Celery message looks like to Redis: a list entry, never saved by
    # a snapshot here (save ""), only by the append-only file.
    _client(url).lpush("celery", "task-1")

    server.stop()

    assert not server.running()
    assert leftovers(under=short_tmp) == []
    assert not server.pid_file.exists()
    assert (server.data_dir / "appendonlydir" / "appendonly.aof.manifest").exists()

    again = _server(short_tmp)
    url = again.start()
    try:
        assert _client(url).lrange("celery", 0, -1) == [b"task-1"]
    finally:
        again.stop()


def test_without_appendonly_nothing_is_kept(short_tmp):
    """The test sessions' Redis keeps nothing; shows the append-only file is what keeps data."""
    server = _server(short_tmp, appendonly=False)
    _client(server.start()).lpush("celery", "task-1")
    server.stop()
    again = _server(short_tmp, appendonly=False)
    try:
        assert _client(again.start()).llen("celery") == 0
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


def test_start_stops_a_leftover_server_on_the_same_data(short_tmp):
    code = (
        "from pathlib import Path\n"
        "from runner.embedded.redis import EmbeddedRedis\n"
        f"root = Path({str(short_tmp)!r})\n"
        "server = EmbeddedRedis(data_dir=root / 'data' / 'redis', run_dir=root / 'run')\n"
        "import redis; redis.Redis.from_url(server.start()).lpush('celery', 'queued')"
    )
    holder = start_and_lose(code)
    try:
        server = _server(short_tmp)
        old_pid = int(server.pid_file.read_text())
        url = server.start()
        try:
            assert not _alive(old_pid)  # two servers must never share one append-only file
            assert _client(url).lrange("celery", 0, -1) == [b"queued"]
        finally:
            server.stop()
    finally:
        holder.kill()
        holder.wait()
    assert leftovers(under=short_tmp) == []


def test_start_ignores_a_stale_pid_file_naming_another_process(short_tmp):
    server = _server(short_tmp)
    server.data_dir.mkdir(parents=True)
    server.pid_file.write_text(f"{os.getpid()}\n")  # a live process, but not a Redis of ours
    url = server.start()
    try:
        assert _client(url).ping()
        assert int(server.pid_file.read_text()) == server.pid
    finally:
        server.stop()
    assert not server.pid_file.exists()


def test_server_dies_with_the_process_that_started_it(short_tmp):
    code = (
        "from pathlib import Path\n"
        "from runner.embedded.redis import EmbeddedRedis\n"
        f"root = Path({str(short_tmp)!r})\n"
        "EmbeddedRedis(data_dir=root / 'data' / 'redis', run_dir=root / 'run').start()\n"
        "import os, signal; print('ready', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    )
    starter = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert starter.stdout.strip() == "ready", starter.stderr
    assert starter.returncode == -signal.SIGKILL
    wait_for(
        lambda: not leftovers(under=short_tmp),
        timeout=30,
        message="redis outlived its killed starter",
    )


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
