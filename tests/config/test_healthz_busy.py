"""/healthz answers 503 within 2 s while other requests hang on a partitioned database.

The run command's gunicorn (runner.supervisor's `web` program, the real argv)
reaches the database through a fault proxy; the proxy drops everything (a
partition), requests that need the database hang, and then /healthz must
still answer in time.

- With sync workers (one request each) two hung requests held both workers
  and /healthz queued behind them: the chaos run's partitions saw its 503
  late. Threads fixed that while a thread was free.
- With every thread held (more hung requests than threads, as on a loaded
  host: the CI chaos run's database fault), gthread queued /healthz behind
  them all; config/gunicorn_worker.py answers it from threads of its own.
  The second test shows both: the shipped worker class answers, plain
  gthread (the wrong twin) does not.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import requests

from config.gunicorn_worker import is_health_request
from runner.processes import free_port
from runner.supervisor import PROGRAMS, context
from tests.support.servers import _stop_group, _wait_http_ok, server_env
from tools.chaos.faultproxy import FaultProxy

pytestmark = pytest.mark.django_db(transaction=True)


def _web_argv(port: int, tmp_path, *, workers: int, threads: int) -> list[str]:
    (web,) = [p for p in PROGRAMS if p.name == "web"]
    ctx = {**context(), "host": "127.0.0.1", "port": str(port), "web_workers": str(workers),
           "web_threads": str(threads), "run": str(tmp_path)}  # fmt: skip
    return [part.format(**ctx) for part in web.argv]


@contextlib.contextmanager
def _web_behind_proxy(tmp_path, argv_tail: tuple[str, ...] = (), *, workers: int, threads: int
                      ) -> Iterator[tuple[str, FaultProxy]]:  # fmt: skip
    """The run command's web program, its database reached through a fault proxy."""
    env = server_env()
    target = urlsplit(env["DATABASE_URL"])
    if not target.port:
        pytest.skip("the database answers on a Unix socket: no TCP for the fault proxy")
    proxy = FaultProxy(target=(target.hostname or "127.0.0.1", target.port)).start()
    env["DATABASE_URL"] = target._replace(
        netloc=target.netloc.replace(f"{target.hostname}:{target.port}", f"127.0.0.1:{proxy.port}")
    ).geturl()
    port = free_port()
    log = tmp_path / "web.log"
    argv = _web_argv(port, tmp_path, workers=workers, threads=threads) + list(argv_tail)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http_ok(f"{url}/healthz", proc, log, 60)
        yield url, proxy
    finally:
        proxy.heal()
        _stop_group(proc)
        proxy.stop()


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


def test_healthz_answers_503_in_time_while_every_worker_has_a_hung_request(tmp_path):
    with _web_behind_proxy(tmp_path, workers=2, threads=8) as (url, proxy):
        proxy.drop()
        _hang(url, 2)
        time.sleep(1.0)  # both requests are in the workers, waiting on the database
        status, took = _healthz(url, 10)
        assert (status, took < 2.0) == (503, True), f"{status} after {took:.1f} s"


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
    with _web_behind_proxy(tmp_path, argv_tail, workers=1, threads=threads) as (url, proxy):
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
