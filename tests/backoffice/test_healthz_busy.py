"""/healthz answers 503 within 2 s while other requests hang on a partitioned database.

The run command's gunicorn (runner.supervisor's `web` program, the real argv)
reaches the database through a fault proxy; the proxy drops everything (a
partition), requests that need the database hang, and then /healthz must
still answer in time.

- With sync workers (one request each) two hung requests hold both workers
  and /healthz queues behind them, so its 503 comes late; threads answer it
  while a thread is free.
- With every thread held (more hung requests than threads, as on a loaded
  host in a database fault), gthread queues /healthz behind them all;
  core/patches/gunicorn_worker.py answers it from threads of its own.
  The second test shows both: the shipped worker class answers, plain
  gthread (the wrong twin) does not.
"""

from __future__ import annotations

import threading
import time

import pytest
import requests

from core.patches.gunicorn_worker import is_health_request
from tests.support.servers import web_behind_db_proxy

pytestmark = pytest.mark.django_db(transaction=True)


def _hang(url: str, count: int) -> None:
    """`count` requests that need the database, each left waiting on it."""
    for _ in range(count):
        threading.Thread(
            target=lambda: requests.get(f"{url}/api/v1/products/", timeout=30), daemon=True
        ).start()


def _healthz(url: str, timeout: float) -> tuple[int | None, float]:
    started = time.monotonic()
    try:
        status: int | None = requests.get(f"{url}/healthz", timeout=timeout).status_code
    except requests.Timeout:
        status = None
    return status, time.monotonic() - started


@pytest.mark.tcp_servers  # the fault proxy needs a TCP PostgreSQL
@pytest.mark.serial  # a bound of a second or two on the answer
def test_healthz_answers_503_in_time_while_every_worker_has_a_hung_request(tmp_path):
    with web_behind_db_proxy(tmp_path, workers=2, threads=8) as (url, proxy):
        proxy.drop()
        _hang(url, 2)
        time.sleep(1.0)  # both requests are in the workers, waiting on the database
        status, took = _healthz(url, 10)
        assert (status, took < 2.0) == (503, True), f"{status} after {took:.1f} s"


@pytest.mark.tcp_servers  # the fault proxy needs a TCP PostgreSQL
@pytest.mark.serial  # a bound of a second or two on the answer
@pytest.mark.parametrize(
    "argv_tail, answered",
    [
        pytest.param((), True, id="shipped-worker-class"),
        # The wrong twin: gunicorn's own gthread, one pool for every request.
        pytest.param(("--worker-class", "gthread"), False, id="gthread-wrong-twin"),
    ],
)
def test_healthz_answers_503_in_time_while_every_thread_holds_a_hung_request(
    tmp_path, argv_tail, answered
):
    threads = 2
    with web_behind_db_proxy(tmp_path, argv_tail, workers=1, threads=threads) as (url, proxy):
        proxy.drop()
        _hang(url, 3 * threads)  # every thread held, and more waiting for one
        time.sleep(1.0)
        status, took = _healthz(url, 2.0)
        if answered:
            assert (status, took < 2.0) == (503, True), f"{status} after {took:.1f} s"
        else:
            # The overlap happened: the hung requests held every thread.
            assert status is None, f"gthread answered {status} after {took:.1f} s"


def test_only_the_health_views_take_the_health_threads():
    assert is_health_request(b"GET /healthz HTTP/1.1\r\n")
    assert is_health_request(b"HEAD /livez HTTP/1.1\r\n")
    assert is_health_request(b"GET /healthz?x=1 HTTP/1.1\r\n")
    assert not is_health_request(b"GET /healthzz HTTP/1.1\r\n")
    assert not is_health_request(b"POST /healthz HTTP/1.1\r\n")
    assert not is_health_request(b"GET /api/v1/products/ HTTP/1.1\r\n")
    assert not is_health_request(b"GET /heal")  # a first segment cut short: the usual pool
