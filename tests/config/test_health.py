"""/healthz answers 200 with both servers up and 503 when either is down or hung (real
processes, within its deadline); /livez answers whatever the dependencies do."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.config.test_broker_outage import redis_server

ROOT = Path(__file__).resolve().parents[2]

CALL_HEALTHZ = """
import django, json
django.setup()
from django.test import Client
r = Client().get('/healthz')
print(json.dumps({'status': r.status_code, 'type': r['Content-Type'], 'body': r.json()}))
"""


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthz(**overrides) -> dict:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="config.settings.base", **overrides)
    out = subprocess.run(
        [sys.executable, "-c", CALL_HEALTHZ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.django_db
def test_healthz_ok(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["checks"] == {"database": "ok", "broker": "ok"}


def test_healthz_503_when_database_down():
    result = _healthz(
        DATABASE_URL=f"postgres://postgres@127.0.0.1:{_closed_port()}/postgres", DB_POOL="false"
    )
    assert result["status"] == 503
    assert result["type"].startswith("application/problem+json")
    assert result["body"]["errors"]["database"] != "ok"
    assert result["body"]["errors"]["broker"] == "ok"


def test_healthz_503_when_broker_down():
    result = _healthz(REDIS_URL=f"redis://127.0.0.1:{_closed_port()}/0")
    assert result["status"] == 503
    assert result["body"]["errors"]["broker"] != "ok"
    assert result["body"]["errors"]["database"] == "ok"


# -- /livez, and /healthz against dependencies that hang (issue 23) --------------------


@contextlib.contextmanager
def blackhole():
    """A TCP port that accepts connections and then passes nothing either way (a hung peer).

    A SIGSTOPped server or a blackholed link looks like this to a client: the
    connect succeeds (the kernel completes it), then no byte ever comes back.
    """
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)  # kept open, never read, never answered

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


@contextlib.contextmanager
def stopped_redis():
    """A scratch redis-server of our own, SIGSTOPped (hung: connects, never answers)."""
    port = _closed_port()
    with redis_server(port) as proc:
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            yield port
        finally:
            os.kill(proc.pid, signal.SIGCONT)


CALL_LIVEZ = """
import django, json
django.setup()
from django.test import Client
r = Client().get('/livez')
print(json.dumps({'status': r.status_code, 'body': r.json()}))
"""


def test_livez_answers_with_every_dependency_down():
    port = _closed_port()
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="config.settings.base",
        DATABASE_URL=f"postgres://postgres@127.0.0.1:{port}/postgres",
        REDIS_URL=f"redis://127.0.0.1:{port}/0",
    )
    out = subprocess.run(
        [sys.executable, "-c", CALL_LIVEZ], env=env, cwd=ROOT, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "status": 200,
        "body": {"status": "ok"},
    }


@pytest.mark.parametrize("pool", ["true", "false"])
def test_healthz_503_at_its_deadline_when_the_database_hangs(pool):
    """A database that accepts and never answers: 503 `timeout` at the deadline, no hang.

    Before the fix the check waited on the request pool (10 s, then `PoolTimeout`) or,
    without a pool, on a connect with no timeout at all (the subprocess timed out).
    """
    with blackhole() as port:
        result = _healthz(
            DATABASE_URL=f"postgres://postgres@127.0.0.1:{port}/postgres", DB_POOL=pool
        )
    assert result["status"] == 503
    assert result["body"]["errors"]["database"] == "timeout"
    assert result["body"]["errors"]["broker"] == "ok"


def test_healthz_503_when_redis_hangs():
    with stopped_redis() as port:
        result = _healthz(REDIS_URL=f"redis://127.0.0.1:{port}/0")
    assert result["status"] == 503
    assert result["body"]["errors"]["broker"] != "ok"
    assert result["body"]["errors"]["database"] == "ok"


HUNG_REDIS_CALLS = """
import django, json
django.setup()
from django.core.cache import cache
from config.celery import app
out = {}
try:
    cache.get('throttle-probe')
    out['cache'] = 'answered'
except Exception as exc:
    out['cache'] = type(exc).__name__
try:
    app.send_task('chaos.none', args=[1], retry=False)
    out['publish'] = 'published'
except Exception as exc:
    out['publish'] = type(exc).__name__
print(json.dumps(out))
"""


def test_a_hung_redis_fails_cache_reads_and_publishes_instead_of_blocking():
    """Throttles (the cache) and the broker's publish on a SIGSTOPped Redis raise, bounded.

    Before the fix both waited on the socket forever (the subprocess timed out).
    """
    with stopped_redis() as port:
        env = dict(
            os.environ,
            DJANGO_SETTINGS_MODULE="config.settings.base",
            REDIS_URL=f"redis://127.0.0.1:{port}/0",
        )
        out = subprocess.run(
            [sys.executable, "-c", HUNG_REDIS_CALLS], env=env, cwd=ROOT, capture_output=True,
            text=True, timeout=90,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["cache"] != "answered"
    assert result["publish"] != "published"
