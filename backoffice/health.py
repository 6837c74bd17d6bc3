"""The health checks: `/livez` and `/healthz` (docs/operations.md, "Liveness and readiness")."""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import kombu
import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from psycopg import pq
from psycopg.conninfo import make_conninfo
from psycopg.pq.abc import PGconn

from core.problems import problem_response

# Seconds each check may take: a health check answers quickly or says "down".
CHECK_TIMEOUT = 1.0
# The whole answer, whatever hangs: the contract's "within 2 s", with room for a cold
# process's first request (URL conf and view imports).
HEALTH_DEADLINE = 1.2


def _wait_socket(pgconn: PGconn, *, write: bool, end: float) -> bool:
    """Wait until the connection's socket is ready (for writing or reading); False at `end`."""
    remaining = end - time.monotonic()
    if remaining <= 0:
        return False
    sock = pgconn.socket
    ready = (
        select.select([], [sock], [], remaining)
        if write
        else select.select([sock], [], [], remaining)
    )
    return bool(ready[0] or ready[1])


def _database_ok(timeout: float = CHECK_TIMEOUT) -> tuple[bool, str]:
    """Connect afresh (never through the pool, whose wait is long) and run SELECT 1,
    all of it within `timeout` seconds by this check's own clock.

    libpq's non-blocking calls, each wait a select() on the socket until the
    deadline: libpq's `connect_timeout` cannot go below 2 s, and nothing
    bounds a query on a server that accepted and then stopped answering
    (SIGSTOP, a blackholed network: the kernel or a proxy still acknowledges
    every packet, so no TCP timeout fires). A check that outlived its health
    check kept reporting "timeout" after the heal (one check per dependency in
    flight): it now always ends by its deadline, and the connection with it.
    """
    end = time.monotonic() + timeout
    params = {
        key: value
        for key, value in connection.get_connection_params().items()
        if key not in ("cursor_factory", "context", "prepare_threshold", "connect_timeout")
    }
    pgconn: PGconn | None = None
    try:
        pgconn = pq.PGconn.connect_start(make_conninfo(**params).encode())
        while True:
            status = pgconn.connect_poll()
            if status == pq.PollingStatus.OK:
                break
            if status == pq.PollingStatus.FAILED:
                return False, "OperationalError"
            if not _wait_socket(pgconn, write=status == pq.PollingStatus.WRITING, end=end):
                return False, "timeout"
        pgconn.nonblocking = 1
        pgconn.send_query(b"SELECT 1")  # raises when it cannot be sent
        while pgconn.flush() == 1:
            if not _wait_socket(pgconn, write=True, end=end):
                return False, "timeout"
        while True:
            pgconn.consume_input()
            if not pgconn.is_busy():
                break
            if not _wait_socket(pgconn, write=False, end=end):
                return False, "timeout"
        result = pgconn.get_result()
        if result is None or result.status != pq.ExecStatus.TUPLES_OK:
            return False, "OperationalError"
        return True, "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means unhealthy
        return False, type(exc).__name__
    finally:
        if pgconn is not None:
            pgconn.finish()


def _redis_ok(url: str) -> tuple[bool, str]:
    try:
        # Half the check's time each for the connect and the PING: the whole
        # check ends within CHECK_TIMEOUT, so none outlives its health check.
        client = redis.Redis.from_url(
            url, socket_connect_timeout=CHECK_TIMEOUT / 2, socket_timeout=CHECK_TIMEOUT / 2
        )
        try:
            client.ping()
        finally:
            client.close()
        return True, "ok"
    except Exception as exc:  # noqa: BLE001
        return False, type(exc).__name__


def _amqp_ok(url: str) -> tuple[bool, str]:
    """Open a real AMQP connection and a channel (handshake, login, vhost), then close it."""
    try:
        with kombu.Connection(url, connect_timeout=CHECK_TIMEOUT, heartbeat=0) as conn:
            conn.ensure_connection(max_retries=0)
            conn.default_channel  # noqa: B018 - opening a channel proves the vhost is usable
        return True, "ok"
    except Exception as exc:  # noqa: BLE001
        return False, type(exc).__name__


def _broker_ok() -> tuple[bool, str]:
    if settings.BROKER_IS_AMQP:
        return _amqp_ok(settings.CELERY_BROKER_URL)
    return _redis_ok(settings.CELERY_BROKER_URL)


# One thread per kind of check at most, per process: a check that hangs on a
# stopped server keeps its thread until the server answers or drops it, and
# the next health check reports "timeout" at once instead of starting another thread.
_running: dict[str, Future] = {}
_running_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_executor_pid = 0


def _pool() -> ThreadPoolExecutor:
    global _executor, _executor_pid
    if _executor is None or _executor_pid != os.getpid():  # a fresh one after a fork
        _executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="healthz")
        _executor_pid = os.getpid()
        _running.clear()
    return _executor


def run_checks(
    checks: dict[str, Callable[[], tuple[bool, str]]], *, deadline: float = HEALTH_DEADLINE
) -> dict[str, tuple[bool, str]]:
    """Run the checks side by side; any not done by the deadline is ("down", "timeout")."""
    futures: dict[str, Future | None] = {}
    with _running_lock:
        pool = _pool()
        for name, check in checks.items():
            previous = _running.get(name)
            if previous is not None and not previous.done():
                futures[name] = None  # still hung from an earlier health check
                continue
            futures[name] = _running[name] = pool.submit(check)
    end = time.monotonic() + deadline
    results: dict[str, tuple[bool, str]] = {}
    for name, future in futures.items():
        if future is None:
            results[name] = (False, "timeout")
            continue
        try:
            results[name] = future.result(timeout=max(0.0, end - time.monotonic()))
        except FutureTimeout:
            results[name] = (False, "timeout")
    return results


def livez(request: HttpRequest) -> HttpResponse:
    """Answer 200 while this process can answer at all: no dependency is checked."""
    return JsonResponse({"status": "ok"})


def healthz(request: HttpRequest) -> HttpResponse:
    """Answer 200 when the database and the broker (and the cache, when it is not the
    broker) answer, 503 otherwise, within HEALTH_DEADLINE seconds either way."""
    checks: dict[str, Callable[[], tuple[bool, str]]] = {
        "database": _database_ok,
        "broker": _broker_ok,
    }
    cache_url = settings.CACHES["default"]["LOCATION"]
    if cache_url != settings.CELERY_BROKER_URL:
        # Throttles live there: a shop whose Redis is gone cannot serve logins.
        checks["cache"] = lambda: _redis_ok(cache_url)
    results = run_checks(checks)
    checks_out = {name: state for name, (_, state) in results.items()}
    if all(ok for ok, _ in results.values()):
        return JsonResponse({"status": "ok", "checks": checks_out})
    return problem_response(
        status=503,
        code="unavailable",
        detail="A dependency is not answering.",
        errors=checks_out,
        headers={"Retry-After": "5"},
    )
