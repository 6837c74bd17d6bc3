"""/healthz answers 503 within 2 s while other requests hang on a partitioned database.

The run command's gunicorn (runner.supervisor's `web` program, the real argv)
with 2 workers reaches the database through a fault proxy; the proxy drops
everything (a partition), two requests that need the database hang, and then
/healthz must still answer in time. With sync workers (one request each) the
two hung requests held both workers and /healthz queued behind them: the
chaos run's partitions saw its 503 late (docs/failure-model.md).
"""

from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit

import pytest
import requests

from runner.processes import free_port
from runner.supervisor import PROGRAMS, context
from tests.support.servers import _stop_group, _wait_http_ok, server_env
from tools.chaos.faultproxy import FaultProxy

pytestmark = pytest.mark.django_db(transaction=True)


def _web_argv(port: int, tmp_path) -> list[str]:
    (web,) = [p for p in PROGRAMS if p.name == "web"]
    ctx = {**context(), "host": "127.0.0.1", "port": str(port), "web_workers": "2",
           "run": str(tmp_path)}  # fmt: skip
    return [part.format(**ctx) for part in web.argv]


def test_healthz_answers_503_in_time_while_every_worker_has_a_hung_request(tmp_path):
    import subprocess

    env = server_env()
    target = urlsplit(env["DATABASE_URL"])
    proxy = FaultProxy(target=(target.hostname or "127.0.0.1", target.port or 5432)).start()
    env["DATABASE_URL"] = target._replace(
        netloc=target.netloc.replace(f"{target.hostname}:{target.port}", f"127.0.0.1:{proxy.port}")
    ).geturl()
    port = free_port()
    log = tmp_path / "web.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            _web_argv(port, tmp_path),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http_ok(f"{url}/healthz", proc, log, 60)
        proxy.drop()
        hung = [
            threading.Thread(
                target=lambda: requests.get(f"{url}/api/v1/products/", timeout=30), daemon=True
            )
            for _ in range(2)
        ]
        for thread in hung:
            thread.start()
        time.sleep(1.0)  # both requests are in the workers, waiting on the database
        started = time.monotonic()
        try:
            response = requests.get(f"{url}/healthz", timeout=10)
            status, took = response.status_code, time.monotonic() - started
        except requests.Timeout:
            status, took = None, time.monotonic() - started
        assert (status, took < 2.0) == (503, True), f"{status} after {took:.1f} s"
    finally:
        proxy.heal()
        _stop_group(proc)
        proxy.stop()
