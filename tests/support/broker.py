"""The shop's queues on the Redis broker, counted as tests and the bench see them."""

from __future__ import annotations

from django.conf import settings


def queue_names() -> tuple[str, ...]:
    """Every queue a worker consumes (CELERY_TASK_QUEUES, docs/celery.md "Queues")."""
    return tuple(settings.SHOP_QUEUES)


def queued(client) -> int:
    """Messages waiting on every queue of a Redis broker (`redis.Redis`)."""
    return sum(client.llen(name) for name in queue_names())


def queued_raw(client) -> list[bytes]:
    """The waiting messages themselves, every queue's."""
    return [raw for name in queue_names() for raw in client.lrange(name, 0, -1)]
