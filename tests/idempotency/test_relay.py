"""The relay with real processes: `manage.py relay_outbox`, a Celery worker, Redis, PostgreSQL.

- killed (SIGKILL-like `exit` failpoint) after publishing and before marking:
  the batch is published again and every consumer suppresses the copy, counted;
- two relays over 10,000 messages: none lost, none claimed by both at once;
- the broker gone for 30 s mid-run (its own redis-server, stopped, restarted
  empty): nothing lost, the backlog drains, each effect once.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection, transaction
from django.db.models import Sum
from django.db.models.functions import Now

from idempotency import metrics
from idempotency.messaging.outbox import outbox_write
from idempotency.models import Delivery, OutboxMessage
from shop import events
from shop.models import LoyaltyAccount, PurchaseHistoryLine
from tests.shop.test_history import order_payload
from tests.support.broker import queued, queued_raw
from tests.support.servers import ROOT, server_env, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

POINTS = 38  # order_payload: 2 x 19.99


def write_orders(user, n: int) -> list[str]:
    ids = []
    with transaction.atomic():
        for i in range(n):
            payload = order_payload(user, number=i + 1)
            ids.append(
                str(
                    outbox_write(
                        aggregate_type="order",
                        aggregate_id=payload["order_id"],
                        event_type=events.ORDER_CONFIRMED,
                        payload=payload,
                    ).id
                )
            )
    return ids


def relay_process(tmp_path, *args: str, **env: str) -> subprocess.Popen:
    log = open(tmp_path / f"relay-{uuid.uuid4().hex[:6]}.log", "ab")  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, "manage.py", "relay_outbox", *args],
        cwd=ROOT,
        env=server_env(SHOP_FAILPOINTS_DIR=str(tmp_path / "failpoints"), **env),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def duplicate_counts() -> dict[str, int]:
    """Suppressed duplicates by mechanism, as every process counted them in the database."""
    return metrics.duplicate_totals()


def effects(user) -> tuple[int, int]:
    points = LoyaltyAccount.objects.filter(user_id=user.pk).values_list("balance", flat=True)
    quantity = PurchaseHistoryLine.objects.filter(user_id=user.pk).aggregate(q=Sum("quantity"))
    return (points.first() or 0), (quantity["q"] or 0)


@pytest.fixture
def broker():
    """The broker's Redis database, emptied before and after (ours alone: REDIS_URL's db)."""
    client = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    client.flushdb()
    yield client
    client.flushdb()


def queued_deliveries(broker) -> int:
    """Deliveries waiting on the broker: the ids of every queued ring (one per consumer batch)."""
    import base64
    import json

    total = 0
    for raw in queued_raw(broker):
        envelope = json.loads(raw)
        body = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        total += len(args[0]) if isinstance(args[0], list) else 1
    return total


def test_a_relay_killed_between_publish_and_mark_publishes_again_and_consumers_suppress(
    shopper, tmp_path, broker, celery_worker_process
):
    n = 20
    write_orders(shopper, n)
    crashed = relay_process(tmp_path, "--once", SHOP_FAILPOINTS="relay.published=exit@1")
    assert crashed.wait(60) == 1  # os._exit(1) at the failpoint: no mark, no cleanup
    assert OutboxMessage.objects.filter(done_at__isnull=True).count() == n
    assert Delivery.objects.count() == 2 * n
    assert set(Delivery.objects.values_list("publishes", flat=True)) == {1}
    assert queued_deliveries(broker) == 2 * n  # published, not marked
    assert broker.llen("events") == queued(broker) == 2  # one ring per consumer for the batch

    # The dead relay's lease runs out (OUTBOX_RELAY_LEASE); the next relay takes the rows.
    OutboxMessage.objects.update(lease_expires_at=Now())
    again = relay_process(tmp_path, "--once")
    assert again.wait(60) == 0
    assert OutboxMessage.objects.filter(done_at__isnull=True).count() == 0
    assert set(Delivery.objects.values_list("publishes", flat=True)) == {2}
    assert queued_deliveries(broker) == 4 * n  # every message twice per consumer

    # One process, so each consumer's second ring runs after its first and meets every
    # row done: a copy counted by the consumer. Two processes may run a consumer's two
    # rings at once; the later claim then skips the rows the earlier one holds (FOR
    # UPDATE SKIP LOCKED, docs/events.md "Batched consumers") and counts nothing.
    celery_worker_process(concurrency=1)
    wait_until(
        lambda: queued(broker) == 0 and Delivery.objects.filter(done_at__isnull=True).count() == 0,
        timeout=120,
        message="the worker drains both copies",
    )

    def copies_counted():
        counts = duplicate_counts()
        return counts[metrics.INBOX_DUPLICATE] == n and counts[metrics.PROCESSED_ID] == n

    wait_until(copies_counted, timeout=60, message="both consumers count every copy")
    assert duplicate_counts()[metrics.INBOX_DUPLICATE] == n
    assert effects(shopper) == (n * POINTS, n * 2)


def test_two_relays_over_10000_messages_lose_none_and_never_share_a_row(shopper, tmp_path, broker):
    n = 10_000
    payload = order_payload(shopper)
    OutboxMessage.objects.bulk_create(
        OutboxMessage(
            aggregate_type="order",
            aggregate_id=str(i),
            event_type=events.ORDER_CONFIRMED,
            payload={**payload, "order_id": str(uuid.uuid4()), "number": i + 1},
        )
        for i in range(n)
    )
    relays = [
        relay_process(tmp_path, "--once", "--batch", "100", "--owner", f"relay-{i}")
        for i in range(2)
    ]
    for proc in relays:
        assert proc.wait(300) == 0
    # None lost: every message published and marked.
    assert OutboxMessage.objects.filter(done_at__isnull=True).count() == 0
    assert Delivery.objects.count() == 2 * n
    # None claimed by both: a row claimed twice would have been published twice
    # (its deliveries' `publishes` counts every publish, relay or sweeper).
    assert set(Delivery.objects.values_list("publishes", flat=True)) == {1}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(DISTINCT lease_owner), count(*) FROM idempotency_delivery"
            " GROUP BY message_id HAVING count(DISTINCT lease_owner) > 1"
        )
        assert cursor.fetchall() == []  # a message's deliveries were written by one relay
    owners = set(Delivery.objects.values_list("lease_owner", flat=True))
    assert owners == {"relay-0", "relay-1"}  # both relays did work, in parallel
    assert queued_deliveries(broker) == 2 * n


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def own_redis(port: int):
    proc = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--port", str(port), "--save", "",
         "--appendonly", "no", "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(port=port)
    wait_until(lambda: _ping(client), timeout=10, message="own redis-server up")
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(5)


def _ping(client) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_the_broker_gone_for_30_seconds_loses_nothing_and_the_backlog_drains(
    shopper, tmp_path, celery_worker_process
):
    port = _free_port()
    broker_url = f"redis://127.0.0.1:{port}/0"
    env = {
        "CELERY_BROKER_URL": broker_url,
        "OUTBOX_DELIVERY_TIMEOUT": "5",
        "OUTBOX_DELIVERY_SWEEP_SECONDS": "1",
    }
    total = 0
    server = own_redis(port)
    server.__enter__()
    relay_proc = relay_process(tmp_path, **env)
    try:
        worker = celery_worker_process(concurrency=2, **env)
        write_orders(shopper, 30)
        total += 30
        time.sleep(1.0)
        # The broker dies with whatever it held (queued and unacked messages).
        server.__exit__(None, None, None)
        # The worker and the relay stay up throughout and recover by themselves.
        for _ in range(6):  # orders keep coming while it is gone: 30 s
            write_orders(shopper, 10)
            total += 10
            time.sleep(5)
        server = own_redis(port)  # back, empty
        server.__enter__()
        write_orders(shopper, 10)
        total += 10
        wait_until(
            lambda: (
                OutboxMessage.objects.filter(done_at__isnull=True).count() == 0
                and Delivery.objects.filter(done_at__isnull=True).count() == 0
                and Delivery.objects.count() == 2 * total
            ),
            timeout=240,
            interval=0.5,
            message=(
                f"backlog drains: {Delivery.objects.filter(done_at__isnull=True).count()} left"
            ),
        )
        assert worker.process.poll() is None  # the same worker: nobody restarted it
    finally:
        stop(relay_proc)
        server.__exit__(None, None, None)
    assert effects(shopper) == (total * POINTS, total * 2)  # each effect once
    assert not Delivery.objects.filter(needs_attention=True).exists()
