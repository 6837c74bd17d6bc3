"""Counters shared by every process, kept in Redis (the `/metrics` endpoint comes later).

Names used so far: `shop_duplicates_suppressed_total{mechanism}` (a replayed
request key, an inbox duplicate) and `shop_idempotency_key_conflicts_total{code}`
(409 in use, 422 reused). A counter is a Redis hash per name, one field per
label set; a Redis outage loses counts, never a request.
"""

from __future__ import annotations

import logging
import os
import threading

import redis
from django.conf import settings

logger = logging.getLogger(__name__)

_local = threading.local()


def _client() -> redis.Redis:
    client = getattr(_local, "client", None)
    if client is None or getattr(_local, "pid", None) != os.getpid():
        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5
        )
        _local.client, _local.pid = client, os.getpid()
    return client


def _hash_key(name: str) -> str:
    prefix = getattr(settings, "METRICS_KEY_PREFIX", None)
    if not prefix:
        prefix = f"{settings.CACHES['default'].get('KEY_PREFIX') or 'shop'}:metrics"
    return f"{prefix}:{name}"


def _labels(labels: dict[str, object]) -> str:
    return ",".join(f'{k}="{labels[k]}"' for k in sorted(labels))


def count(name: str, amount: int = 1, **labels: object) -> None:
    """Add `amount` to the counter `name` with these labels; never fail the caller."""
    try:
        _client().hincrby(_hash_key(name), _labels(labels), amount)
    except redis.RedisError as exc:
        logger.warning("metric %s not counted: %s", name, exc)


def read(name: str) -> dict[str, int]:
    """Return {label text: value} for the counter `name` (label text like `code="x"`)."""
    raw = _client().hgetall(_hash_key(name))
    return {k.decode(): int(v) for k, v in raw.items()}
