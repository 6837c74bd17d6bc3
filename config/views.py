"""Operational endpoints: health, and metrics (config/metrics.py)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import kombu
import psycopg
import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse

from core.problems import problem_response

from .metrics import metrics_view  # noqa: F401 - routed in config/urls.py

# Seconds each check may take: a health check answers quickly or says "down".
CHECK_TIMEOUT = 1.0
# The whole answer, whatever hangs: the contract's "within 2 s", with room for a cold
# process's first request (URL conf and view imports).
HEALTH_DEADLINE = 1.2


def _database_ok() -> tuple[bool, str]:
    """Connect afresh (never through the pool, whose wait is long) and run SELECT 1.

    `connect_timeout` bounds the connection; a server that accepts and then
    stops answering (SIGSTOP, a blackholed network) is bounded by the
    caller's deadline instead.
    """
    params = {
        key: value
        for key, value in connection.get_connection_params().items()
        # connect_timeout: the settings' own (DB_CONNECT_TIMEOUT) is replaced by the check's.
        if key not in ("cursor_factory", "context", "prepare_threshold", "connect_timeout")
    }
    try:
        with psycopg.connect(
            **params, connect_timeout=max(1, int(CHECK_TIMEOUT)), autocommit=True
        ) as conn:
            conn.execute("SELECT 1").fetchone()
        return True, "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means unhealthy
        return False, type(exc).__name__


def _redis_ok(url: str) -> tuple[bool, str]:
    try:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=CHECK_TIMEOUT, socket_timeout=CHECK_TIMEOUT
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
