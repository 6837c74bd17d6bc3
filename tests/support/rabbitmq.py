"""RabbitMQ for the tests that run Celery on it (tests/config/test_rabbitmq.py).

`SHOP_TEST_RABBITMQ_URL` names the broker (default the local server's vhost
`/`, as in CI; give each engineer's run its own vhost). Tests marked
`rabbitmq` are skipped when nothing answers there, unless
`SHOP_REQUIRE_RABBITMQ=1` (then they fail: CI must not skip them silently).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import kombu
import pytest

RABBITMQ_URL = os.environ.get("SHOP_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def available(url: str = RABBITMQ_URL) -> bool:
    try:
        with kombu.Connection(url, connect_timeout=2, heartbeat=0) as conn:
            conn.ensure_connection(max_retries=0)
        return True
    except Exception:  # noqa: BLE001 - whatever the reason, there is no broker here
        return False


def require() -> None:
    """Skip the calling test when RabbitMQ does not answer (fail when it is required)."""
    if available():
        return
    message = f"RabbitMQ does not answer at {RABBITMQ_URL.split('@')[-1]}"
    if os.environ.get("SHOP_REQUIRE_RABBITMQ") == "1":
        pytest.fail(message)
    pytest.skip(message)


def connection(url: str = RABBITMQ_URL) -> kombu.Connection:
    """A connection with publisher confirms, as the shop's own publishers have on amqp."""
    return kombu.Connection(url, transport_options={"confirm_publish": True}, heartbeat=0)


def send_task(name: str, args: Sequence = (), **options) -> None:
    """Publish task `name` to RabbitMQ (confirmed) from the test process, whose app is on Redis."""
    from config.celery import app

    with connection() as conn:
        app.send_task(name, args=list(args), connection=conn, **options)


def _queues(queue: str | None) -> tuple[str, ...]:
    from tests.support.broker import queue_names

    return (queue,) if queue else queue_names()


def queue_depth(queue: str | None = None) -> int:
    """Messages ready in `queue`, or in every shop queue (0 for one not declared yet)."""
    total = 0
    with connection() as conn:
        channel: Any = conn.default_channel  # py-amqp's Channel (kombu types it StdChannel)
        for name in _queues(queue):
            try:
                total += channel.queue_declare(name, passive=True).message_count
            except Exception:  # noqa: BLE001 - NOT_FOUND: nobody declared it yet
                channel = conn.channel()  # the failed passive declare closed the channel
    return total


def purge(queue: str | None = None) -> None:
    """Empty `queue`, or every shop queue."""
    with connection() as conn:
        channel: Any = conn.default_channel
        for name in _queues(queue):
            try:
                channel.queue_purge(name)
            except Exception:  # noqa: BLE001 - NOT_FOUND: nothing to purge
                channel = conn.channel()
