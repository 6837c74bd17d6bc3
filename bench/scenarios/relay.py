"""The outbox relay: rows -> broker (batched), and end to end (row written -> effect committed).

1. `relay publish`: N outbox rows (`order.confirmed`: one delivery per
   consumer registered for it, F = `fanout()`, so F x N deliveries; F is 3
   with the e-mails consumer on, 2 without) relayed in-process by
   `relay_once` batches on one producer connection; events/s = deliveries
   published per second (target >= 2,000),
   beside redis-benchmark's ops/s of the same run (`rps_per_redis_ops`).
2. `end to end burst`: N rows written at once with a real relay process and
   a real Celery worker (2 processes) running; events/s = deliveries done per
   second, as a ratio of pgbench TPS (`rps_per_pgbench_tps`). The consumers
   are batched (docs/events.md, "Batched consumers"): one task message per
   consumer per OUTBOX_CONSUMER_BATCH deliveries, so `queued` (broker
   messages after the publish-only run) is about F x N / batch, not F x N.
   Targets (issue 21): >= 1,000 deliveries/s, and >= 10 x the checkout
   orders/s of the same run (bench/report.py compares the two scenarios).
3. `steady 300/s`, then `steady ½ burst` (half the deliveries/s the burst
   reached): rows written at that rate for `--steady-seconds` (300 s; 10 s
   with --quick); lag = delivery `done_at` - message `created_at` (both the
   database clock), p50 / p99 (target p99 < 2 s), and bounded: the p99 of
   the last window (a minute, or a fifth of a shorter run) at most
   BOUNDED_GROWTH_S above the p99 of the first, plus the fitted slope of lag
   over the run.

The queued messages are on the bench's broker (REDIS_URL). Before the burst
and before each steady phase the harness waits until no delivery and no mail
is left to do (`_settle`): the worker consumes the publish-only run's rings,
and with them the outbox backlog earlier scenarios left, before anything is
timed.

For the capacity model (docs/performance.md) the burst and each steady phase
carry `cpu_s` and `cpu_ms_per_delivery` (bench/cpu.py): the CPU of the Celery
worker's process tree, the relay process's and the whole PostgreSQL server's
(its postmaster's tree), from the first row written (the burst: right after
its rows were written in one go) to the last delivery done. The harness's
own polls of the deliveries (one count every 0.2 s) are in PostgreSQL's figure.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

from bench import cpu
from bench.processes import spawn, stop
from bench.shop import postgres_cpu_source

NAME = "relay"
DESCRIPTION = "outbox relay: rows -> broker events/s (batched), end to end events/s and lag"
ORDER = 60
TARGETS = {
    "publish_events_per_s": 2000,
    "end_to_end_events_per_s": 1000,
    "end_to_end_vs_checkout_orders_per_s": 10,
    "steady_lag_p99_s": 2.0,
}
SHOPPERS = 1000  # the events' owners, in turn
STEADY_RATE = 300  # events/s (deliveries): 300 / fanout() messages/s
TICKS_PER_S = 10  # the steady writer writes a batch of messages every 100 ms
# A steady run's lag is bounded when its last window's p99 is at most this much above
# its first window's: a backlog that grows by more than that over the run is not steady.
BOUNDED_GROWTH_S = 0.5
ROOT = Path(__file__).resolve().parents[2]
EVENT_TYPE = "order.confirmed"


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
            event_type=EVENT_TYPE,
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


def _lags(ids: list) -> list[tuple[float, float]]:
    """(seconds since the first message was written, lag) of every delivery done, oldest first."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXTRACT(EPOCH FROM o.created_at - MIN(o.created_at) OVER ()),"
            " EXTRACT(EPOCH FROM d.done_at - o.created_at) FROM idempotency_delivery d"
            " JOIN idempotency_outboxmessage o ON o.id = d.message_id"
            " WHERE d.message_id = ANY(%s::uuid[]) AND d.done_at IS NOT NULL"
            " ORDER BY o.created_at",
            [[str(i) for i in ids]],
        )
        return [(float(r[0]), float(r[1])) for r in cursor.fetchall()]


def _done(ids: list) -> int:
    """Deliveries of these messages done (the relay writes them; the consumer marks them)."""
    from django.db import connection

    # One array, not an IN list: a step writes more messages than a statement
    # carries values when the server binds them (docs/performance.md,
    # "Prepared statements").
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM idempotency_delivery"
            " WHERE done_at IS NOT NULL AND message_id = ANY(%s::uuid[])",
            [[str(i) for i in ids]],
        )
        return cursor.fetchone()[0]


def fanout() -> int:
    """Deliveries per message: the consumers registered for the event this scenario writes."""
    from idempotency.messaging.relay import consumers_for

    return len(consumers_for(EVENT_TYPE))


def _drain(ids: list, *, timeout: float) -> bool:
    """Wait until every delivery of every message is done; False when `timeout` passed."""
    deadline = time.perf_counter() + timeout
    while _done(ids) < fanout() * len(ids):
        if time.perf_counter() > deadline:
            return False
        time.sleep(0.2)
    return True


def _pending() -> tuple[int, int]:
    """Deliveries not done and mails not sent, of every message (dead letters aside)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM idempotency_delivery"
            "  WHERE done_at IS NULL AND NOT needs_attention),"
            " (SELECT count(*) FROM shop_mail WHERE done_at IS NULL AND NOT needs_attention)"
        )
        return cursor.fetchone()


def _settle(ctx, *, before: str, timeout: float = 600.0) -> None:
    """Wait until no delivery and no mail is left to do, whoever wrote it; log the wait.

    A phase measures the pipeline at its own rate only if nothing else is
    queued: the consumers' rings take the oldest due deliveries ahead of their
    own (docs/events.md, "Batched consumers"), so a backlog left by the
    publish-only run or by earlier scenarios' orders would be done inside the
    next phase and read as its lag (docs/performance.md, "Relay").
    """
    started = time.perf_counter()
    first = pending = _pending()
    while any(pending):
        if time.perf_counter() - started > timeout:
            raise RuntimeError(f"{before}: {pending[0]} deliveries, {pending[1]} mails left")
        time.sleep(0.2)
        pending = _pending()
    ctx.log(
        f"  before {before}: {first[0]} deliveries and {first[1]} mails left to do,"
        f" done in {time.perf_counter() - started:.1f} s"
    )


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of lag over write time (s of lag per s of run)."""
    if len(points) < 2:
        return 0.0
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0


def lag_figures(points: list[tuple[float, float]], seconds: float) -> dict:
    """Lag percentiles of a steady run, and whether the lag stayed bounded.

    Bounded: the p99 of the last window (a minute, or a fifth of a shorter
    run) is at most BOUNDED_GROWTH_S above the p99 of the first window.
    """
    lags = [lag for _, lag in points]
    window = min(60.0, seconds / 5)
    span = points[-1][0] if points else 0.0  # first write to last write
    first = [lag for t, lag in points if t < window]
    last = [lag for t, lag in points if t >= span - window]
    first_p99, last_p99 = _percentile(first, 0.99), _percentile(last, 0.99)
    return {
        "deliveries": len(lags),
        "lag_p50_s": round(_percentile(lags, 0.50), 3),
        "lag_p99_s": round(_percentile(lags, 0.99), 3),
        "lag_max_s": round(max(lags) if lags else 0.0, 3),
        "window_s": round(window, 1),
        "written_over_s": round(span, 1),
        "first_window_p99_s": round(first_p99, 3),
        "last_window_p99_s": round(last_p99, 3),
        "lag_slope_s_per_s": round(_slope(points), 5),
        "bounded": bool(first and last) and last_p99 - first_p99 <= BOUNDED_GROWTH_S,
    }


def _with_cpu(figures: dict, sources: dict, before: dict, deliveries: int) -> dict:
    """`figures` plus the CPU the sources spent since `before`, in all and per delivery."""
    spent = cpu.spent(before, cpu.read(sources))
    return {**figures, "cpu_s": spent, "cpu_ms_per_delivery": cpu.per_unit_ms(spent, deliveries)}


def _steady(
    owners: list[int], *, rate: float, seconds: float, start: int, sources: dict | None = None
) -> dict:
    """Write messages for `rate` deliveries/s (`fanout()` each) for `seconds`; return the lags."""
    sources = sources or {}
    cpu_before = cpu.read(sources)
    written: list = []
    started = time.perf_counter()
    tick = 0
    owed = 0.0  # messages due but not yet written (the rate need not divide into ticks)
    while time.perf_counter() - started < seconds:
        owed += rate / fanout() / TICKS_PER_S
        batch = int(owed)
        owed -= batch
        if batch:
            written += _write(owners, batch, start=start + len(written))
        tick += 1
        pause = started + tick / TICKS_PER_S - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    elapsed = time.perf_counter() - started
    drained = _drain(written, timeout=max(300.0, seconds))
    spent = cpu.spent(cpu_before, cpu.read(sources))
    figures = lag_figures(_lags(written), elapsed)
    return {
        "target_events_per_s": round(rate, 1),
        "offered_events_per_s": round(fanout() * len(written) / elapsed, 1),
        "seconds": round(elapsed, 1),
        "messages": len(written),
        "drained": drained,
        **figures,
        "cpu_s": spent,
        "cpu_ms_per_delivery": cpu.per_unit_ms(spent, fanout() * len(written)),
    }


def run(ctx) -> dict:
    import redis
    from django.conf import settings

    from core.api_tokens import api_tokens_of
    from idempotency.messaging import relay

    # Many shoppers, as the sustained and growth scenarios' 1,000: one shopper's
    # points are one row, and every event for it would queue on that row
    # (loyalty's optimistic retries), not on the relay; and that row's list of
    # applied ids is rewritten by every event, so a shopper with thousands of
    # events in a run measures that list (docs/events.md, "Retention of applied
    # ids"), not the pipeline (docs/performance.md, "Relay").
    tokens = ctx.tokens(SHOPPERS)
    owners = list(api_tokens_of(tokens).values_list("user_id", flat=True))
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
    publish_rps = fanout() * published / elapsed if elapsed else 0.0
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
    worker = spawn(
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
    relay_proc = spawn([sys.executable, "manage.py", "relay_outbox"], env, logs / "bench-relay.log")
    steady: dict = {}
    sources = {
        "worker": cpu.tree_source(worker.pid),
        "relay": cpu.tree_source(relay_proc.pid),
        "postgres": postgres_cpu_source(ctx),
    }
    try:
        time.sleep(5)  # both up
        _settle(ctx, before="the burst")  # the publish-only run's rings, still queued
        burst = _write(owners, n, start=n)
        cpu_before = cpu.read(sources)
        started = time.perf_counter()
        if not _drain(burst, timeout=600):
            left = fanout() * n - _done(burst)
            raise RuntimeError(f"end to end burst did not drain: {left} left")
        elapsed = time.perf_counter() - started
        e2e_rps = fanout() * n / elapsed
        burst_run = _with_cpu(
            {
                "label": "end to end burst",
                "concurrency": 2,
                "rps": round(e2e_rps, 1),
                "latency_ms": {"p50": None, "p99": None},
                "messages": n,
                "deliveries": fanout() * n,
                "seconds": round(elapsed, 3),
            },
            sources,
            cpu_before,
            fanout() * n,
        )
        runs.append(burst_run)
        ctx.log(
            f"  end to end burst: {e2e_rps:.0f} events/s; CPU ms per delivery "
            f"{burst_run['cpu_ms_per_delivery']}"
        )

        # Steady load at a fixed rate, then at half of what this run's burst reached.
        start = 2 * n
        for name, rate in (("fixed", STEADY_RATE), ("half_burst", e2e_rps / 2)):
            _settle(ctx, before=f"steady {rate:.0f}/s")
            figures = _steady(
                owners, rate=rate, seconds=ctx.steady_seconds, start=start, sources=sources
            )
            start += figures["messages"]
            steady[name] = figures
            ctx.log(
                f"  steady {figures['offered_events_per_s']:.0f} events/s for "
                f"{figures['seconds']:.0f} s: lag p50 {figures['lag_p50_s']} s, p99 "
                f"{figures['lag_p99_s']} s (target < {TARGETS['steady_lag_p99_s']} s); p99 "
                f"first {figures['window_s']:.0f} s {figures['first_window_p99_s']} s, last "
                f"{figures['last_window_p99_s']} s; CPU ms per delivery "
                f"{figures['cpu_ms_per_delivery']}"
            )
            runs.append(
                {
                    "label": "steady 300/s" if name == "fixed" else "steady ½ burst",
                    "concurrency": 2,
                    "rps": figures["offered_events_per_s"],
                    "latency_ms": {
                        "p50": round(figures["lag_p50_s"] * 1000, 1),
                        "p99": round(figures["lag_p99_s"] * 1000, 1),
                    },
                    "cpu_s": figures["cpu_s"],
                    "cpu_ms_per_delivery": figures["cpu_ms_per_delivery"],
                }
            )
    finally:
        stop(relay_proc)
        stop(worker)
    lag_target = TARGETS["steady_lag_p99_s"]
    return {
        "runs": runs,
        "steady": steady,
        "fanout": fanout(),
        "targets": dict(TARGETS),
        "met": {
            "publish": publish_rps >= TARGETS["publish_events_per_s"],
            **{
                f"steady_{name}_lag_p99": figures["lag_p99_s"] < lag_target
                for name, figures in steady.items()
            },
            **{f"steady_{name}_bounded": figures["bounded"] for name, figures in steady.items()},
        },
    }
