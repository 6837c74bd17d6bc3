"""Operational endpoints: health, and metrics (config/metrics.py)."""

from __future__ import annotations

import kombu
import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse

from core.problems import problem_response

from .metrics import metrics_view  # noqa: F401 - routed in config/urls.py

# Seconds each check may take: a health check answers quickly or says "down".
CHECK_TIMEOUT = 1.0


def _database_ok() -> tuple[bool, str]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
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


def healthz(request: HttpRequest) -> HttpResponse:
    """Answer 200 when the database and the broker (and the cache, when it is not the
    broker) answer, 503 otherwise."""
    results = {"database": _database_ok(), "broker": _broker_ok()}
    cache_url = settings.CACHES["default"]["LOCATION"]
    if cache_url != settings.CELERY_BROKER_URL:
        # Throttles live there: a shop whose Redis is gone cannot serve logins.
        results["cache"] = _redis_ok(cache_url)
    checks = {name: state for name, (_, state) in results.items()}
    if all(ok for ok, _ in results.values()):
        return JsonResponse({"status": "ok", "checks": checks})
    return problem_response(
        status=503,
        code="unavailable",
        detail="A dependency is not answering.",
        errors=checks,
        headers={"Retry-After": "5"},
    )
