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
