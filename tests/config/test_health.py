"""/healthz answers 200 with both servers up and 503 when either is down (real processes)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

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


def _healthz(code: str = CALL_HEALTHZ, **overrides) -> dict:
    """Run `code` (default: one GET /healthz) in a fresh process with `overrides`; its JSON."""
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="config.settings.base", **overrides)
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
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


# -- a dependency that hangs instead of refusing (SIGSTOP, a partition) -------------

CALL_HEALTHZ_TIMED = """
import django, json, threading, time
django.setup()
from django.test import Client
client = Client()
answers = []
for _ in range(3):
    start = time.monotonic()
    r = client.get('/healthz')
    answers.append({'status': r.status_code, 'seconds': time.monotonic() - start,
                    'body': r.json()})
threads = sum(1 for t in threading.enumerate() if t.name.startswith('healthz'))
print(json.dumps({'answers': answers, 'threads': threads}))
"""


def _assert_503_within_2_s(result: dict, *, down: str) -> None:
    for answer in result["answers"]:
        assert answer["status"] == 503
        assert answer["body"]["errors"][down] != "ok"
        assert answer["seconds"] < 2.0, answer  # the contract's bound, not a speed figure
    # A hung check keeps its one thread; later probes do not start more.
    assert result["threads"] <= 3


def test_healthz_503_within_2_s_when_the_database_hangs():
    from tests.support.blackhole import blackhole

    with blackhole() as port:
        result = _healthz(
            CALL_HEALTHZ_TIMED,
            DATABASE_URL=f"postgres://postgres@127.0.0.1:{port}/postgres",
            DB_POOL="false",
        )
    _assert_503_within_2_s(result, down="database")
    assert result["answers"][0]["body"]["errors"]["broker"] == "ok"


def test_healthz_503_within_2_s_when_the_redis_broker_hangs():
    from tests.support.blackhole import blackhole

    with blackhole() as port:
        url = f"redis://127.0.0.1:{port}/0"
        result = _healthz(CALL_HEALTHZ_TIMED, CELERY_BROKER_URL=url, REDIS_URL=url)
    _assert_503_within_2_s(result, down="broker")
    assert result["answers"][0]["body"]["errors"]["database"] == "ok"


def test_healthz_503_within_2_s_when_the_rabbitmq_broker_hangs():
    from tests.support.blackhole import blackhole

    with blackhole() as port:
        result = _healthz(
            CALL_HEALTHZ_TIMED, CELERY_BROKER_URL=f"amqp://guest:guest@127.0.0.1:{port}//"
        )
    _assert_503_within_2_s(result, down="broker")


def test_livez_answers_without_any_dependency():
    """Liveness: 200 with the database and the broker both gone."""
    env_db = f"postgres://postgres@127.0.0.1:{_closed_port()}/postgres"
    code = (
        "import django, json; django.setup(); from django.test import Client; "
        "r = Client().get('/livez'); print(json.dumps([r.status_code, r.json()]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(
            os.environ,
            DJANGO_SETTINGS_MODULE="config.settings.base",
            DATABASE_URL=env_db,
            DB_POOL="false",
            CELERY_BROKER_URL=f"redis://127.0.0.1:{_closed_port()}/0",
        ),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [200, {"status": "ok"}]
