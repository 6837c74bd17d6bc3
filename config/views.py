"""Operational endpoints: liveness, health, and metrics (config/metrics.py).

`/livez` checks nothing: the process answers, so it lives. `/healthz` asks
the database and the broker (and the cache when it is not the broker) and
answers within HEALTH_DEADLINE either way: each check runs in a thread of its
own on a fresh connection with its own short timeouts, never on the request
pool, and the view waits for them up to the deadline. A dependency that
stopped answering (a SIGSTOPped server, a blackholed link) is reported as
`timeout` and the answer is 503, not a request hanging on a pool.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import kombu
import psycopg
import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse

from core.problems import problem_response

from .metrics import metrics_view  # noqa: F401 - routed in config/urls.py

# Seconds each check's connect and read may take: a health check answers quickly or says "down".
CHECK_TIMEOUT = 1.0
# Seconds the whole /healthz answer may take (the contract: 2 s, with a margin).
HEALTH_DEADLINE = 1.5

# One check per dependency in flight per process: while a check is still
# hanging (its own timeouts end it), the next /healthz reports `timeout` at
# once instead of starting another thread, so a long outage never piles up
# threads or connections.
_in_flight: dict[str, Future] = {}
_in_flight_lock = threading.Lock()


def _database_params() -> dict:
    """libpq parameters of the default database, with the health check's own short timeouts."""
    params = dict(connection.get_connection_params())
    for key in ("cursor_factory", "context", "prepare_threshold", "client_encoding"):
        params.pop(key, None)
    # libpq's connect_timeout has a floor of 2 s; the view's deadline bounds the answer anyway.
    params["connect_timeout"] = 2
    params["options"] = (
        f"{params.get('options', '')} -c statement_timeout={int(CHECK_TIMEOUT * 1000)}"
    ).strip()
    return params


def _database_ok() -> str:
    # A fresh connection, not the request pool: a pool whose connections hang
    # on a stopped server would make the check wait for the pool's timeout.
    with psycopg.connect(**_database_params(), autocommit=True) as conn:
        conn.execute("SELECT 1").fetchone()
    return "ok"


def _redis_ok(url: str) -> str:
    client = redis.Redis.from_url(
        url, socket_connect_timeout=CHECK_TIMEOUT, socket_timeout=CHECK_TIMEOUT
    )
    try:
        client.ping()
    finally:
        client.close()
    return "ok"


def _amqp_ok(url: str) -> str:
    """Open a real AMQP connection and a channel (handshake, login, vhost), then close it."""
    # Reads and writes on the established socket are bounded too (a broker that
    # accepts the connection and then hangs).
    timeouts = {"read_timeout": CHECK_TIMEOUT, "write_timeout": CHECK_TIMEOUT}
    with kombu.Connection(
        url, connect_timeout=CHECK_TIMEOUT, heartbeat=0, transport_options=timeouts
    ) as conn:
        conn.ensure_connection(max_retries=0)
        conn.default_channel  # noqa: B018 - opening a channel proves the vhost is usable
    return "ok"


def _broker_ok() -> str:
    if settings.BROKER_IS_AMQP:
        return _amqp_ok(settings.CELERY_BROKER_URL)
    return _redis_ok(settings.CELERY_BROKER_URL)


def _start(name: str, check: Callable[[], str]) -> Future:
    """Run `check` in a daemon thread (or return the one still running for `name`)."""
    with _in_flight_lock:
        running = _in_flight.get(name)
        if running is not None and not running.done():
            return running
        future: Future = Future()
        _in_flight[name] = future

    def run() -> None:
        try:
            future.set_result(check())
        except Exception as exc:  # noqa: BLE001 - any failure means unhealthy
            future.set_result(type(exc).__name__)

    threading.Thread(target=run, name=f"healthz-{name}", daemon=True).start()
    return future


def run_checks(checks: dict[str, Callable[[], str]], *, deadline: float) -> dict[str, str]:
    """Run every check at once; each answers its state, or `timeout` after `deadline` seconds."""
    futures = {name: _start(name, check) for name, check in checks.items()}
    end = time.monotonic() + deadline
    states = {}
    for name, future in futures.items():
        remaining = max(0.0, end - time.monotonic())
        try:
            states[name] = future.result(timeout=remaining)
        except TimeoutError:
            states[name] = "timeout"
    return states


def livez(request: HttpRequest) -> HttpResponse:
    """200 while this process can answer at all: no dependency is checked."""
    return JsonResponse({"status": "ok"})


def healthz(request: HttpRequest) -> HttpResponse:
    """Answer 200 when the database and the broker (and the cache, when it is not the
    broker) answer, 503 otherwise, within HEALTH_DEADLINE either way."""
    checks: dict[str, Callable[[], str]] = {"database": _database_ok, "broker": _broker_ok}
    cache_url = settings.CACHES["default"]["LOCATION"]
    if cache_url != settings.CELERY_BROKER_URL:
        # Throttles live there: a shop whose Redis is gone cannot serve logins.
        checks["cache"] = lambda: _redis_ok(cache_url)
    states = run_checks(checks, deadline=HEALTH_DEADLINE)
    if all(state == "ok" for state in states.values()):
        return JsonResponse({"status": "ok", "checks": states})
    return problem_response(
        status=503,
        code="unavailable",
        detail="A dependency is not answering.",
        errors=states,
        headers={"Retry-After": "5"},
    )
