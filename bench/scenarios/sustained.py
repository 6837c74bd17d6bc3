"""Sustained: the whole shop on this machine, keyed checkouts at a rising fixed rate.

The headline figure of `make bench`: how many orders a second this machine
takes with everything that follows an order keeping up.

The shop runs as production runs it, on the bench database: gunicorn with
the shop's worker class and WEB_THREADS request threads per worker (the
Procfile's `web`; WEB_WORKERS of them, as the run command starts it) paid
at the simulated provider (bench/shop.py), one Celery worker per queue at
Celery's own concurrency, the relay process and beat (bench/processes.py,
`start_pipeline`). Each step
sends keyed `POST /api/v1/orders/` open loop (bench/loadgen.py `run_open`:
due at a fixed rate whatever the answers, latency counted from the due time)
for `--sustained-seconds` (180 s; quick 10 s) at one rate of
`--sustained-rates` (20,40,60,80,100,120; quick 5,10), rising, each
order by one of SHOPPERS shoppers in turn. After the load a step
waits (at most DRAIN_MAX_S) for the pipeline to finish the step's messages,
then reads from the database, per consumer of the step's outbox messages
(loyalty, history, e-mails) and for the mail sender, the lag of every
effect: effect committed (`done_at` of the delivery, or of the mail: when it
was sent) minus the outbox row written (`created_at`), both by the database
clock; an effect still missing counts with the lag it has so far.

A step is **kept up** when every answer is 201, checkout p99 < CHECKOUT_P99_MS,
every consumer's lag p99 < LAG_P99_S, and neither grows: the p99 of the
step's last window (a minute, or a third of a shorter step) is at most
LATENCY_GROWTH_MS (latency) or LAG_GROWTH_S (lag) above its first window's.
The headline, `sustained_orders_per_s`, is the highest rate kept up; the
ladder stops at the first step that is not. Each step also carries the CPU
of every process of the shop and of PostgreSQL from its start to the end of
its drain (PostgreSQL twice: the whole server, and BACKENDS: the bench
database's backends, the harness's own reads included), per order committed
in that time (`orders_committed`: a request that timed out may still have
placed its order; the capacity model's check).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import time

from bench import cpu, processes
from bench.loadgen import OpenLoadResult, Request, run_open
from bench.shop import (
    backends_cpu_source,
    order_request,
    postgres_cpu_source,
    shop_with_provider,
)

NAME = "sustained"
DESCRIPTION = (
    "the whole shop (gunicorn, a worker per queue, relay, beat): keyed checkouts open loop "
    "at rising rates; checkout p99 and every consumer's lag"
)
ORDER = 15  # after catalog_reads, before anything fills the outbox with a backlog

CHECKOUT_P99_MS = 500.0
LAG_P99_S = 2.0
LAG_GROWTH_S = 0.5
LATENCY_GROWTH_MS = 250.0
DRAIN_MAX_S = 60.0
MAX_IN_FLIGHT = 64
WARMUP_S = 30.0
MAIL_SENDER = "mail sender"
# The bench database's backends alone: part of "postgres" (the whole server), not added
# to the total; on a shared server the one to read (bench/cpu.py, `backends_source`).
BACKENDS = "postgres-backends"
# Beside the shop, on the same cores, never in its total: the harness (the load
# generator and the lag reads) and the simulated provider.
LOADGEN = "loadgen"
PROVIDER = "provider"
OUTSIDE = (BACKENDS, LOADGEN, PROVIDER)
# The shoppers the load takes turns among. A shop taking 80 orders a second has
# thousands; each of these places one every SHOPPERS / rate seconds.
SHOPPERS = 1000
# gunicorn's request threads per worker, as the Procfile's `web` runs it.
WEB_THREADS = 8
# gunicorn's workers, as the run command starts the shop on a machine
# (WEB_CONCURRENCY's default, runner/supervisor.py): one per core of this
# machine kind. `--workers` is the other scenarios' (sync workers, one request
# each); here 8 threads each serve the requests.
WEB_WORKERS = 2
DEFAULT_RATES = (20.0, 40.0, 60.0, 80.0, 100.0, 120.0)
QUICK_RATES = (5.0, 10.0)
DEFAULT_SECONDS = 180.0
QUICK_SECONDS = 10.0


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank q-quantile (0 < q <= 1) of `values`; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


def window_for(seconds: float) -> float:
    """The first and last window a step's growth is judged on: a minute, or a third."""
    return min(60.0, seconds / 3)


def growth(points: list[tuple[float, float]], seconds: float) -> dict:
    """p50, p99 and the first and last window's p99 of (time in the step, value) points."""
    window = window_for(seconds)
    values = [v for _, v in points]
    first = [v for t, v in points if t < window]
    last = [v for t, v in points if t >= seconds - window]
    first_p99, last_p99 = percentile(first, 0.99), percentile(last, 0.99)
    return {
        "count": len(values),
        "p50": _round(percentile(values, 0.50)),
        "p99": _round(percentile(values, 0.99)),
        "max": _round(max(values) if values else None),
        "first_window_p99": _round(first_p99),
        "last_window_p99": _round(last_p99),
        "growth": _round(last_p99 - first_p99)
        if first_p99 is not None and last_p99 is not None
        else None,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def kept_up(step: dict) -> dict:
    """Which of the step's conditions held: answers, latency, lag, neither growing."""
    latency = step["checkout_ms"]
    lags = step["lag_s"]
    answers_ok = step["answered_201"] == step["sent"] and step["sent"] > 0
    latency_ok = latency["p99"] is not None and latency["p99"] < CHECKOUT_P99_MS
    latency_flat = latency["growth"] is not None and latency["growth"] <= LATENCY_GROWTH_MS
    lag_ok = bool(lags) and all(
        f["p99"] is not None and f["p99"] < LAG_P99_S for f in lags.values()
    )
    lag_flat = bool(lags) and all(
        f["growth"] is not None and f["growth"] <= LAG_GROWTH_S for f in lags.values()
    )
    checks = {
        "all_201": answers_ok,
        "checkout_p99": latency_ok,
        "checkout_flat": latency_flat,
        "lag_p99": lag_ok,
        "lag_flat": lag_flat,
    }
    return {**checks, "kept_up": all(checks.values())}


def verdict_text(step: dict) -> str:
    """ "kept up", or "NOT kept up" with the rules the step failed in brackets."""
    if step["verdict"]["kept_up"]:
        return "kept up"
    failed = [k for k, v in step["verdict"].items() if k != "kept_up" and not v]
    return f"NOT kept up ({', '.join(failed)})" if failed else "NOT kept up"


def headline(steps: list[dict]) -> float | None:
    """The highest rate of the steps kept up (None: not even the first)."""
    rates = [s["rate"] for s in steps if s["verdict"]["kept_up"]]
    return max(rates) if rates else None


# --- the pipeline's lag, read from the database ------------------------------------------


def _db_now() -> float:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float")
        return float(cursor.fetchone()[0])


def effects(since: float, until: float) -> tuple[dict[str, list[tuple[float, float]]], int, float]:
    """Lags of the effects of the outbox messages written in [since, until) (database clock).

    Returns ({consumer or MAIL_SENDER: [(written, lag)]}, effects still missing,
    the database's now). `written` is seconds after `since`; a missing effect's
    lag is now - written so far. Expected effects: one per consumer registered
    for the message's type, and one mail per message the e-mails consumer
    turned into a mail (or has not applied yet).
    """
    from django.db import connection

    from idempotency.messaging.relay import consumers_for

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id::text, event_type, EXTRACT(EPOCH FROM created_at)::float"
            " FROM idempotency_outboxmessage"
            " WHERE created_at >= to_timestamp(%s) AND created_at < to_timestamp(%s)",
            [since, until],
        )
        messages = cursor.fetchall()
        ids = [m[0] for m in messages]
        cursor.execute(
            "SELECT message_id::text, consumer, EXTRACT(EPOCH FROM done_at)::float"
            " FROM idempotency_delivery WHERE message_id = ANY(%s::uuid[])",
            [ids],
        )
        done = {(m, c): at for m, c, at in cursor.fetchall()}
        cursor.execute(
            "SELECT message_id, EXTRACT(EPOCH FROM done_at)::float FROM shop_mail"
            " WHERE message_id = ANY(%s)",
            [ids],
        )
        mails = dict(cursor.fetchall())
        cursor.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float")
        now = float(cursor.fetchone()[0])
    lags: dict[str, list[tuple[float, float]]] = {}
    missing = 0
    for message_id, event_type, written in messages:
        for consumer in consumers_for(event_type):
            at = done.get((message_id, consumer.name))
            missing += at is None
            lags.setdefault(consumer.name, []).append(
                (written - since, (at if at is not None else now) - written)
            )
            if consumer.name != "emails":
                continue
            if at is not None and message_id not in mails:
                continue  # applied, and no mail for this event
            sent = mails.get(message_id)
            missing += sent is None
            lags.setdefault(MAIL_SENDER, []).append(
                (written - since, (sent if sent is not None else now) - written)
            )
    for points in lags.values():
        points.sort()
    return lags, missing, now


def orders_committed(since: float, until: float) -> int:
    """Orders written in [since, until) by the database clock."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM orders_order"
            " WHERE created_at >= to_timestamp(%s) AND created_at < to_timestamp(%s)",
            [since, until],
        )
        return int(cursor.fetchone()[0])


def _drain(since: float, until: float, *, limit: float) -> tuple[dict, int, float]:
    """Wait (at most `limit` s) until every effect of the window is committed; return effects."""
    deadline = time.monotonic() + limit
    started = time.monotonic()
    while True:
        lags, missing, _ = effects(since, until)
        if not missing or time.monotonic() >= deadline:
            return lags, missing, round(time.monotonic() - started, 1)
        time.sleep(0.5)


def _wait_idle(*, limit: float) -> int:
    """Wait (at most `limit` s) until no outbox message of the last hour misses an effect."""
    deadline = time.monotonic() + limit
    while True:
        now = _db_now()
        _, missing, _ = effects(now - 3600, now)
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(1)


# --- one step ------------------------------------------------------------------------------


def step_figures(
    *, rate: float, seconds: float, load: OpenLoadResult, lags: dict, missing: int
) -> dict:
    """A step's figures and verdict from its open-loop run and its effects' lags."""
    ok = [(due, latency) for due, latency, status in load.samples if status == 201]
    every = [(due, latency) for due, latency, _ in load.samples]
    step = {
        "rate": rate,
        "seconds": round(seconds, 1),
        "sent": len(load.samples),
        "answered_201": len(ok),
        "orders_per_s": round(len(ok) / seconds, 1) if seconds else 0.0,
        "status": {str(code): n for code, n in sorted(load.statuses.items())},
        "errors": dict(load.errors),
        "late_starts": load.late_starts,
        "checkout_ms": growth(every, seconds),
        "lag_s": {name: growth(points, seconds) for name, points in sorted(lags.items())},
        "effects_missing_after_drain": missing,
    }
    step["verdict"] = kept_up(step)
    return step


def _step(shop, order, *, rate: float, seconds: float, sources: dict) -> dict:
    before = cpu.read(sources)
    since = _db_now()
    load = run_open(
        shop.base_url, factory=order, rate=rate, duration=seconds, max_in_flight=MAX_IN_FLIGHT
    )
    until = _db_now()
    lags, missing, drained_s = _drain(since, until, limit=min(DRAIN_MAX_S, max(10.0, seconds)))
    step = step_figures(rate=rate, seconds=load.duration_s, load=load, lags=lags, missing=missing)
    spent = cpu.spent(before, cpu.read(sources))
    # Per order the shop committed, answered in time or not (a timed-out request's
    # order still cost its CPU).
    orders = orders_committed(since, _db_now())
    step["drain_s"] = drained_s
    step["orders_committed"] = orders
    step["cpu_s"] = spent
    step["cpu_ms_per_order"] = cpu.per_unit_ms(spent, orders)
    known = [v for name, v in spent.items() if v is not None and name not in OUTSIDE]
    step["cpu_ms_per_order_total"] = round(1000 * sum(known) / orders, 2) if orders else None
    return step


def _describe(step: dict) -> str:
    lat = step["checkout_ms"]
    lags = ", ".join(
        f"{name} p50 {f['p50']} / p99 {f['p99']} s (+{f['growth']})"
        for name, f in step["lag_s"].items()
    )
    return (
        f"{step['rate']:g}/s for {step['seconds']:.0f} s: {step['orders_per_s']} orders/s, "
        f"checkout p50 {lat['p50']} / p99 {lat['p99']} ms (+{lat['growth']}); lag {lags}; "
        f"{verdict_text(step)}; CPU ms per order {step['cpu_ms_per_order_total']}"
    )


def run(ctx) -> dict:
    ctx = dataclasses.replace(ctx, workers=WEB_WORKERS)
    rates = list(ctx.sustained_rates or (QUICK_RATES if ctx.quick else DEFAULT_RATES))
    seconds = float(ctx.sustained_seconds or (QUICK_SECONDS if ctx.quick else DEFAULT_SECONDS))
    tokens = ctx.tokens(SHOPPERS)
    headers = [ctx.auth_headers(token) for token in tokens]
    skus = list(ctx.skus)
    steps: list[dict] = []
    with contextlib.ExitStack() as stack:
        workdir, provider_url, server = shop_with_provider(
            stack, ctx, prefix="bench-sustained-", threads=WEB_THREADS
        )
        env = {
            **server.env,
            "PYTHONUNBUFFERED": "1",
            "DB_POOL": "true",
            "PAYMENTS_PROVIDER_URL": provider_url,
        }
        procs = processes.start_pipeline(stack, env, workdir)
        shop = dataclasses.replace(ctx, base_url=server.base_url, server=server)
        sources = {
            "web": server.cpu_seconds,
            **{name: cpu.tree_source(proc.pid) for name, proc in procs.items()},
            "postgres": postgres_cpu_source(ctx),
            BACKENDS: backends_cpu_source(ctx),
            LOADGEN: cpu.self_source(),
            PROVIDER: cpu.child_source("devtools.simulator"),
        }
        ctx.log(
            f"  gunicorn {server.base_url} ({ctx.workers} workers × {WEB_THREADS} threads), "
            f"{', '.join(procs)}; provider {provider_url}"
        )

        def order(n: int) -> Request:
            return order_request(headers[n % len(headers)], random.Random(n).choice(skus))

        # Warm every process and every request thread (imports, pooled connections) and
        # let beat's first round of work pass, at the first step's rate, then start from
        # an idle pipeline: a cold start is not what a step measures.
        run_open(
            shop.base_url,
            factory=order,
            rate=rates[0],
            duration=min(WARMUP_S, seconds),
            max_in_flight=MAX_IN_FLIGHT,
        )
        backlog = _wait_idle(limit=120)
        ctx.log(f"  warmed; effects missing before the first step: {backlog}")
        for rate in rates:
            step = _step(shop, order, rate=rate, seconds=seconds, sources=sources)
            steps.append(step)
            ctx.log("  " + _describe(step))
            if gone := processes.exited(procs):
                raise RuntimeError(f"{', '.join(gone)} exited (logs: {workdir})")
            if not step["verdict"]["kept_up"]:
                break
    sustained = headline(steps)
    ctx.log(
        f"  SUSTAINED: {sustained if sustained is not None else 'none'} orders/s "
        f"(checkout p99 < {CHECKOUT_P99_MS:.0f} ms, lag p99 < {LAG_P99_S:g} s, neither growing)"
    )
    return {
        "sustained_orders_per_s": sustained,
        "steps": steps,
        "rates": rates,
        "step_seconds": seconds,
        "web": {"workers": ctx.workers, "threads": WEB_THREADS},
        "celery_workers": list(processes.QUEUES),  # one worker each, Celery's concurrency
        "criteria": {
            "checkout_p99_ms": CHECKOUT_P99_MS,
            "lag_p99_s": LAG_P99_S,
            "checkout_growth_ms": LATENCY_GROWTH_MS,
            "lag_growth_s": LAG_GROWTH_S,
            "window_s": window_for(seconds),
        },
        # Each step as a run: plotted and listed like the other scenarios' runs.
        "runs": [
            {
                "label": f"{s['rate']:g}/s",
                "concurrency": MAX_IN_FLIGHT,
                "rps": s["orders_per_s"],
                "requests": s["sent"],
                "latency_ms": {"p50": s["checkout_ms"]["p50"], "p99": s["checkout_ms"]["p99"]},
            }
            for s in steps
        ],
    }
