"""Operational endpoints: health, and metrics (config/metrics.py)."""

import redis
from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from kombu import Connection

from core.problems import problem_response

from .metrics import metrics_view  # noqa: F401 - routed in config/urls.py


def _database_ok() -> tuple[bool, str]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        return True, "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means unhealthy
        return False, type(exc).__name__


def _broker_ok() -> tuple[bool, str]:
    url = settings.CELERY_BROKER_URL
    try:
        if not url.startswith(("redis://", "rediss://", "unix://")):
            # RabbitMQ (amqp://) or another kombu transport: one connection attempt.
            with Connection(url, connect_timeout=1) as conn:
                conn.connect()
            return True, "ok"
        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        try:
            client.ping()
        finally:
            client.close()
        return True, "ok"
    except Exception as exc:  # noqa: BLE001
        return False, type(exc).__name__


def healthz(request):
    """Answer 200 when the database and the broker answer, 503 otherwise."""
    db_ok, db_state = _database_ok()
    broker_ok, broker_state = _broker_ok()
    checks = {"database": db_state, "broker": broker_state}
    if db_ok and broker_ok:
        return JsonResponse({"status": "ok", "checks": checks})
    return problem_response(
        status=503,
        code="unavailable",
        detail="A dependency is not answering.",
        errors=checks,
        headers={"Retry-After": "5"},
    )
