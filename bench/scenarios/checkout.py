"""Checkout: keyed POST /api/v1/orders/ paid through the simulated provider.

The harness's gunicorn knows no provider, so this scenario starts its own
simulator (`python -m devtools.simulator --port 0`) and a second gunicorn
with the same environment plus `PAYMENTS_PROVIDER_URL`; both are stopped at
the end whatever happens.

- `order` at 4, 16 and 64 in flight: one line (1 unit of a random seeded
  sku, a million units each), `pm_card_ok`, a fresh key per request: the
  whole flow (claim, hold, order, payment row; capture at the provider;
  record, commit the flag). Target: orders/s >= 0.08 x pgbench TPS.
- `replay` at the same levels: 64 orders finished before the load, sent
  again with the same key and body (answered from the stored answer: one
  indexed read, no write). Target: replay >= 3x first (`order`).
- `unkeyed` at the same levels: the same checkout without its request key
  (`POST /api/v1/_test/orders-unkeyed/`, mounted because this scenario's
  gunicorn runs `tests.support.bench_settings`; `tests.support.unkeyed.UnkeyedRun`
  runs the same phases as plain transactions). Target: keyed >= 0.9x unkeyed.
- `hot`: 500 attempts for one sku with 100 units at 16 in flight: exactly
  100 answers 201 (the rest 409 insufficient_stock), on_hand and reserved
  end at 0. Target: sales/s while the stock lasts (first request to the
  100th 201) >= 0.5 x the uncontended orders/s at the same concurrency;
  attempts/s is reported too.
- `profile`: orders placed one at a time in the harness process, their SQL
  statements and the provider call timed, then one under cProfile: where
  the time of one request goes.

Every load run also carries `cpu_s` (bench/cpu.py): the CPU seconds of the
whole PostgreSQL server (the postmaster's process tree) in its measured
window, beside gunicorn's `server_cpu_s`; `capacity` holds, per level of
`order`, the web and PostgreSQL CPU milliseconds per order (the capacity
model, docs/performance.md). No Celery worker or relay runs here: the
pipeline's share of an order is measured per delivery by the relay scenario.
"""

from __future__ import annotations

import contextlib
import cProfile
import dataclasses
import json
import pstats
import random
import time
import uuid
from decimal import Decimal
from pathlib import Path

import requests as http

from bench import cpu
from bench.loadgen import Request
from bench.server import ROOT
from bench.shop import order_request, postgres_cpu_source, shop_with_provider

NAME = "checkout"
DESCRIPTION = (
    "keyed POST /orders/ paid at the simulator: 4/16/64 in flight, replays, unkeyed, "
    "hot sku, profile"
)
ORDER = 50

LEVELS = (4, 16, 64)
HOT_UNITS, HOT_ATTEMPTS, HOT_CONCURRENCY = 100, 500, 16
REPLAY_KEYS = 64
TARGETS = {
    "orders_per_pgbench_tps": 0.08,
    "hot_vs_uncontended": 0.5,
    "replay_vs_first": 3.0,
    "keyed_vs_unkeyed": 0.9,
}


def capacity(runs: list[dict], label: str = "order") -> dict:
    """Web (gunicorn) and PostgreSQL CPU ms per order of every `label` run, by level."""
    figures = {}
    for run in runs:
        if run["label"] != label or not run.get("requests"):
            continue
        per_order = cpu.per_unit_ms(
            {"web": run["server_cpu_s"], **run.get("cpu_s", {})}, run["requests"]
        )
        figures[str(run["concurrency"])] = {
            "orders_per_s": run["rps"],
            "web_ms": per_order.get("web"),
            "postgres_ms": per_order.get("postgres"),
        }
    return figures


def _profile_one(token: str, sku: str, provider_url: str, *, samples: int = 20) -> dict:
    """Place orders in this process; return where the time of one goes.

    First `samples` orders without a profiler: wall time split into SQL (as
    the driver saw it, every statement), the provider call and the rest
    (Python: Django, DRF, the services). Then one order under cProfile for
    the functions that cost the most.
    """
    import requests as http
    from django.db import connection
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    spent = {"sql": 0.0, "statements": 0, "provider": 0.0}
    original = http.Session.request

    def timed_request(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            spent["provider"] += time.perf_counter() - started

    def timed_sql(execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            spent["sql"] += time.perf_counter() - started
            spent["statements"] += 1

    body = json.loads(order_request({}, sku).body)

    def place() -> None:
        response = client.post(
            "/api/v1/orders/", body, format="json", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex
        )
        if response.status_code != 201:
            raise AssertionError(f"profiled order answered {response.status_code}")

    from django.test.utils import override_settings

    with override_settings(PAYMENTS_PROVIDER_URL=provider_url):
        for _ in range(3):  # warm: imports, install id, first connections
            place()
        http.Session.request = timed_request
        try:
            with connection.execute_wrapper(timed_sql):
                started = time.perf_counter()
                for _ in range(samples):
                    place()
                wall = time.perf_counter() - started
        finally:
            http.Session.request = original
        profiler = cProfile.Profile()
        profiler.enable()
        place()
        profiler.disable()
    stats = pstats.Stats(profiler)
    top = []
    for (filename, line, func), (_, calls, _, cumulative, _) in sorted(
        stats.stats.items(), key=lambda item: item[1][3], reverse=True
    ):
        if f"{ROOT}/" not in filename or "/.venv/" in filename:
            continue
        top.append(
            {
                "function": f"{Path(filename).relative_to(ROOT)}:{line} {func}",
                "calls": calls,
                "cumulative_ms": round(cumulative * 1000, 2),
            }
        )
        if len(top) == 15:
            break
    per = 1000 / samples
    return {
        "samples": samples,
        "wall_ms": round(wall * per, 2),
        "sql_ms": round(spent["sql"] * per, 2),
        "sql_statements": round(spent["statements"] / samples, 1),
        "provider_ms": round(spent["provider"] * per, 2),
        "python_ms": round((wall - spent["sql"] - spent["provider"]) * per, 2),
        "top_cumulative_one_order_under_cprofile": top,
        "note": "in the harness process, one request at a time, no gunicorn; SQL time includes "
        "the round trip and commit waits",
    }


def run(ctx) -> dict:
    """Run the uncontended levels, the hot sku and the profile against a provider-backed shop."""
    from inventory.models import StockItem
    from inventory.services import product_create
    from orders.models import Order

    tokens = ctx.tokens(32)
    token_headers = [ctx.auth_headers(token) for token in tokens]
    skus = list(ctx.skus)
    with contextlib.ExitStack() as stack:
        # The bench's settings mount the unkeyed baseline (the same checkout, no key).
        workdir, provider_url, server = shop_with_provider(stack, ctx, prefix="bench-checkout-")
        shop = dataclasses.replace(
            ctx,
            base_url=server.base_url,
            server=server,
            cpu_sources={"postgres": postgres_cpu_source(ctx)},
        )
        ctx.log(f"  provider {provider_url}; checkout gunicorn on {server.base_url}")

        def order(worker: int, seq: int) -> Request:
            rng = random.Random(worker * 1_000_003 + seq)
            return order_request(token_headers[worker % len(tokens)], rng.choice(skus))

        def unkeyed(worker: int, seq: int) -> Request:
            rng = random.Random(worker * 1_000_003 + seq)
            return order_request(token_headers[worker % len(tokens)], rng.choice(skus), keyed=False)

        # Orders finished before the load; `replay` sends them again, byte for byte.
        finished = []
        for i in range(REPLAY_KEYS):
            request = order_request(token_headers[i % len(tokens)], skus[i % len(skus)])
            answer = http.post(
                shop.base_url + request.path, data=request.body, headers=request.headers, timeout=30
            )
            if answer.status_code != 201:
                raise AssertionError(f"seeding a replayed order answered {answer.status_code}")
            finished.append(request)

        def replay(worker: int, seq: int) -> Request:
            return finished[(worker * 7 + seq) % len(finished)]

        def must_be_replayed(request: Request, response) -> None:
            if response.headers.get("idempotent-replayed") != "true":
                raise AssertionError(f"not a replay: {response.status} {response.body[:200]!r}")

        runs, uncontended, ratios = [], {}, {}
        for concurrency in shop.concurrency_levels(LEVELS):
            result = shop.load(
                label="order", concurrency=concurrency, factory=order, expected=(201,)
            )
            again = shop.load(
                label="replay",
                concurrency=concurrency,
                factory=replay,
                expected=(201,),
                on_response=must_be_replayed,
            )
            plain = shop.load(
                label="unkeyed", concurrency=concurrency, factory=unkeyed, expected=(201,)
            )
            runs += [result, again, plain]
            uncontended[concurrency] = result["rps"]
            ratios[str(concurrency)] = {
                "replay_vs_first": round(again["rps"] / result["rps"], 3)
                if result["rps"]
                else None,
                "keyed_vs_unkeyed": round(result["rps"] / plain["rps"], 3)
                if plain["rps"]
                else None,
            }
            ctx.log(f"  c={concurrency}: {ratios[str(concurrency)]}")

        hot_sku = f"HOT-{uuid.uuid4().hex[:8]}"
        product_create(
            sku=hot_sku, name="Hot", price=Decimal("10.00"), currency="EUR", stock=HOT_UNITS
        )
        confirmed: list[float] = []
        started = [0.0]

        def hot(worker: int, seq: int) -> Request:
            if not started[0]:
                started[0] = time.perf_counter()
            return order_request(token_headers[worker % len(tokens)], hot_sku)

        def count(request, response) -> None:
            if response.status == 201:
                confirmed.append(time.perf_counter())

        hot_run = shop.load(
            label="hot",
            concurrency=HOT_CONCURRENCY,
            factory=hot,
            max_requests=HOT_ATTEMPTS,
            warmup=0,
            expected=(201, 409),
            on_response=count,
        )
        runs.append(hot_run)
        stock = StockItem.objects.get(product__sku=hot_sku)
        sold = Order.objects.filter(lines__sku=hot_sku, status="confirmed").count()
        # While units last, every answer may be a sale: the rate of sales from the
        # first request to the 100th sale is what competes with the uncontended rate.
        selling_s = (max(confirmed) - started[0]) if confirmed else 0.0
        hot_orders_per_s = len(confirmed) / selling_s if selling_s else 0.0
        base = uncontended.get(HOT_CONCURRENCY) or max(uncontended.values())
        hot_result = {
            "attempts": hot_run["requests"],
            "answered_201": len(confirmed),
            "orders_confirmed": sold,
            "on_hand": stock.on_hand,
            "reserved": stock.reserved,
            "exactly_100_sold": sold == HOT_UNITS == len(confirmed)
            and (stock.on_hand, stock.reserved) == (0, 0),
            "seconds_to_sell_out": round(selling_s, 2),
            "orders_per_s_while_stock_lasted": round(hot_orders_per_s, 1),
            "uncontended_orders_per_s": round(base, 1),
            "hot_vs_uncontended": round(hot_orders_per_s / base, 3) if base else None,
            "attempts_per_s_vs_uncontended": round(hot_run["rps"] / base, 3) if base else None,
        }
        ctx.log(f"  hot sku: {hot_result}")
        if not hot_result["exactly_100_sold"]:
            raise AssertionError(f"hot sku oversold or undersold: {hot_result}")

        profile = _profile_one(tokens[0], skus[0], provider_url)
        ctx.log(
            "  one order: {wall_ms} ms = SQL {sql_ms} ms ({sql_statements} statements) + "
            "provider {provider_ms} ms + Python {python_ms} ms".format(**profile)
        )
    per_order = capacity(runs)
    ctx.log(f"  CPU ms per order (web, PostgreSQL) by level: {per_order}")
    return {
        "runs": runs,
        "ratios": ratios,
        "hot": hot_result,
        "profile": profile,
        "capacity": per_order,
        "targets": dict(TARGETS),
    }
