"""The outbox relay: rows -> broker (batched), and end to end (row written -> effect committed).

1. `relay publish`: N outbox rows (`order.confirmed`, two consumers: 2N
   deliveries) relayed in-process by `relay_once` batches on one producer
   connection; events/s = deliveries published per second (target >= 2,000),
   beside redis-benchmark's ops/s of the same run (`rps_per_redis_ops`).
2. `end to end burst`: N rows written at once with a real relay process and
   a real Celery worker (2 processes) running; events/s = deliveries done per
   second, as a ratio of pgbench TPS (`rps_per_pgbench_tps`). The consumers
   are batched (docs/events.md, "Batched consumers"): one task message per
   consumer per OUTBOX_CONSUMER_BATCH deliveries, so `queued` (broker
   messages after the publish-only run) is about 2N / batch, not 2N.
3. `steady 300/s`: rows written at 300 events/s (150 messages/s x 2
   consumers) for the run's duration; lag = delivery `done_at` - message
   `created_at` (both the database clock), p50 / p99 (target p99 < 2 s).

The queued messages are on the bench's broker (REDIS_URL): the publish-only
run deletes its own queue afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

NAME = "relay"
DESCRIPTION = "outbox relay: rows -> broker events/s (batched), end to end events/s and lag"
ORDER = 60
TARGETS = {"publish_events_per_s": 2000, "steady_lag_p99_s": 2.0}
STEADY_RATE = 300  # events/s (deliveries), i.e. 150 messages/s to two consumers
ROOT = Path(__file__).resolve().parents[2]


def _payload(owner_id: int, number: int) -> dict:
    return {
        "order_id": str(uuid.uuid4()),
        "number": number,
        "owner_id": owner_id,
        "status": "confirmed",
        "total": "19.99",
        "currency": "EUR",
        "lines": [
            {
                "sku": "TEE-M",
                "quantity_requested": 1,
                "quantity_confirmed": 1,
                "unit_price": "19.99",
                "status": "confirmed",
            }
        ],
    }


def _write(owners: list[int], n: int, start: int = 0) -> list:
    from idempotency.models import OutboxMessage

    rows = OutboxMessage.objects.bulk_create(
        OutboxMessage(
            aggregate_type="order",
            aggregate_id=str(start + i),
            event_type="order.confirmed",
            payload=_payload(owners[(start + i) % len(owners)], start + i + 1),
        )
        for i in range(n)
    )
    return [r.pk for r in rows]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _lags(ids: list) -> list[float]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXTRACT(EPOCH FROM d.done_at - o.created_at) FROM idempotency_delivery d"
            " JOIN idempotency_outboxmessage o ON o.id = d.message_id"
            " WHERE d.message_id = ANY(%s::uuid[]) AND d.done_at IS NOT NULL",
            [[str(i) for i in ids]],
        )
        return [float(r[0]) for r in cursor.fetchall()]


def _undone(ids: list) -> int:
    from idempotency.models import Delivery

    return Delivery.objects.filter(message_id__in=ids, done_at__isnull=True).count()


def _spawn(argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    out = open(log, "ab")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )


def _stop(proc: subprocess.Popen) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def run(ctx) -> dict:
    import redis
    from django.conf import settings
    from rest_framework.authtoken.models import Token

    from idempotency import relay

    # Many shoppers: one shopper's points are one row, and every event for
    # it would queue on that row (loyalty's optimistic retries), not on the relay.
    tokens = ctx.tokens(50)
    owners = list(Token.objects.filter(key__in=tokens).values_list("user_id", flat=True))
    n = 200 if ctx.quick else 5000
    runs = []

    # 1. publish only (no worker yet): the relay's own speed.
    _write(owners, n)
    started = time.perf_counter()
    published = 0
    while (done := relay.relay_once(limit=settings.OUTBOX_RELAY_BATCH)) > 0:
        published += done
    elapsed = time.perf_counter() - started
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    queued = sum(broker.llen(name) for name in settings.SHOP_QUEUES)
    broker.delete(*settings.SHOP_QUEUES)
    publish_rps = 2 * published / elapsed if elapsed else 0.0
    runs.append(
        {
            "label": "relay publish",
            "concurrency": 1,
            "rps": round(publish_rps, 1),
            "latency_ms": {"p50": None, "p99": None},
            "messages": published,
            "queued": queued,
            "seconds": round(elapsed, 3),
        }
    )
    ctx.log(
        f"  relay publish: {publish_rps:.0f} events/s ({published} messages, batch "
        f"{settings.OUTBOX_RELAY_BATCH}; target {TARGETS['publish_events_per_s']})"
    )

    # 2 and 3: a real relay process and a real worker.
    # The harness itself runs without the pool (DB_POOL=false); the shop's processes keep it.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "DB_POOL": "true"}
    logs = Path(os.environ.get("BENCH_LOG_DIR") or "/tmp")
    worker = _spawn(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "--concurrency",
            "2",
            "--loglevel",
            "warning",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--hostname",
            f"bench-{uuid.uuid4().hex[:6]}@%h",
        ],
        env,
        logs / "bench-relay-worker.log",
    )
    relay_proc = _spawn(
        [sys.executable, "manage.py", "relay_outbox"], env, logs / "bench-relay.log"
    )
    steady: dict = {}
    try:
        time.sleep(5)  # both up
        burst = _write(owners, n, start=n)
        started = time.perf_counter()
        deadline = started + 600
        while _undone(burst) or len(_lags(burst)) < 2 * n:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"end to end burst did not drain: {_undone(burst)} left")
            time.sleep(0.2)
        elapsed = time.perf_counter() - started
        e2e_rps = 2 * n / elapsed
        runs.append(
            {
                "label": "end to end burst",
                "concurrency": 2,
                "rps": round(e2e_rps, 1),
                "latency_ms": {"p50": None, "p99": None},
                "messages": n,
                "seconds": round(elapsed, 3),
            }
        )
        ctx.log(f"  end to end burst: {e2e_rps:.0f} events/s")

        seconds = max(ctx.duration, 5.0)
        per_tick = STEADY_RATE // 2 // 10  # messages every 100 ms
        written: list = []
        started = time.perf_counter()
        tick = 0
        while time.perf_counter() - started < seconds:
            written += _write(owners, per_tick, start=2 * n + len(written))
            tick += 1
            pause = started + tick * 0.1 - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        rate = 2 * len(written) / (time.perf_counter() - started)
        deadline = time.perf_counter() + 300
        while _undone(written) or len(_lags(written)) < 2 * len(written):
            if time.perf_counter() > deadline:
                break
            time.sleep(0.2)
        lags = _lags(written)
        steady = {
            "offered_events_per_s": round(rate, 1),
            "deliveries": len(lags),
            "lag_p50_s": round(_percentile(lags, 0.50), 3),
            "lag_p99_s": round(_percentile(lags, 0.99), 3),
            "lag_max_s": round(max(lags) if lags else 0.0, 3),
        }
        ctx.log(
            f"  steady {rate:.0f} events/s: lag p50 {steady['lag_p50_s']} s, "
            f"p99 {steady['lag_p99_s']} s (target < {TARGETS['steady_lag_p99_s']} s)"
        )
        runs.append(
            {
                "label": f"steady {STEADY_RATE}/s",
                "concurrency": 2,
                "rps": round(rate, 1),
                "latency_ms": {
                    "p50": round(steady["lag_p50_s"] * 1000, 1),
                    "p99": round(steady["lag_p99_s"] * 1000, 1),
                },
            }
        )
    finally:
        _stop(relay_proc)
        _stop(worker)
    return {
        "runs": runs,
        "steady": steady,
        "targets": dict(TARGETS),
        "met": {
            "publish": publish_rps >= TARGETS["publish_events_per_s"],
            "steady_lag_p99": bool(steady) and steady["lag_p99_s"] < TARGETS["steady_lag_p99_s"],
        },
    }
