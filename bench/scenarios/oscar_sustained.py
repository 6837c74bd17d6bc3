"""django-oscar's whole checkout at its own sustained rate: the peer of the headline.

The sustained scenario asks how many orders a second the whole shop takes
with everything after an order keeping up; this one asks the same of
django-oscar 4.2 (bench/oscar_peer.py: its own environment, database
`<bench db>_oscar`, gunicorn with as many workers as ours and the same
WEB_THREADS threads each), so the report can say ours ÷ Oscar at the
sustained rate (issue 34, item 5).

Each step starts Oscar's whole browser checkout (`oscar_peer.Browser`:
product page, basket, guest e-mail, shipping address, preview, place
order, thank-you page; a fresh shopper each) open loop (bench/loadgen.py
`open_loop`: due at a fixed rate whatever the answers, latency counted from
the due time to the thank-you page) for `--sustained-seconds` at one rate of
`--oscar-sustained-rates` (OSCAR_RATES; quick QUICK_RATES), rising.

Oscar has no pipeline (its order is complete when the thank-you page is
there), so the kept-up rule is the sustained scenario's for latency alone,
with the budget per HTTP request the shopper waits on: a step is **kept
up** when every checkout placed its order, the checkout's p99 is below
CHECKOUT_P99_MS times the requests one checkout takes, and its last
window's p99 is at most LATENCY_GROWTH_MS times as many above its first
window's. `oscar_sustained_orders_per_s` is the highest rate kept up; the
ladder stops at the first step that is not. Each step carries Oscar's
gunicorn CPU and PostgreSQL's per order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading

import requests as http

from bench import cpu, oscar_peer
from bench.loadgen import OpenLoadResult, open_loop
from bench.oscar_peer import PRODUCT, Browser
from bench.scenarios.sustained import (
    BACKENDS,
    CHECKOUT_P99_MS,
    DEFAULT_SECONDS,
    LATENCY_GROWTH_MS,
    MAX_IN_FLIGHT,
    QUICK_SECONDS,
    WEB_THREADS,
    WEB_WORKERS,
    growth,
    headline,
    verdict_text,
    window_for,
)
from bench.shop import backends_cpu_source, postgres_cpu_source

NAME = "oscar_sustained"
DESCRIPTION = (
    "django-oscar 4.2's whole browser checkout open loop at rising rates: its sustained "
    "orders/s, the peer of the headline"
)
ORDER = 16  # right after the sustained scenario: the headline and its peer side by side

OSCAR_RATES = (2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 25.0, 30.0)
QUICK_RATES = (1.0, 2.0)
PLACED = 302  # the place-order POST redirected to the thank-you page


def checkout(base_url: str, product: dict) -> tuple[int | str, int]:
    """One shopper's whole checkout; (the place-order answer or the failure's kind, requests)."""
    browser = Browser(base_url)
    try:
        browser.to_preview(product)
        status = browser.place_order()
        if status == PLACED:
            browser.thank_you()
    except (http.RequestException, AssertionError) as exc:
        return type(exc).__name__, browser.requests
    return status, browser.requests


def kept_up(step: dict) -> dict:
    """Which of the step's conditions held: every order placed, latency low and flat."""
    latency = step["checkout_ms"]
    per = step["requests_per_checkout"] or 1.0
    checks = {
        "all_placed": step["placed"] == step["sent"] and step["sent"] > 0,
        "checkout_p99": latency["p99"] is not None and latency["p99"] < CHECKOUT_P99_MS * per,
        "checkout_flat": latency["growth"] is not None
        and latency["growth"] <= LATENCY_GROWTH_MS * per,
    }
    return {**checks, "kept_up": all(checks.values())}


def step_figures(*, rate: float, seconds: float, load: OpenLoadResult, requests: list[int]) -> dict:
    """A step's figures and verdict from its open-loop run and the requests each checkout took."""
    every = [(due, latency) for due, latency, _ in load.samples]
    placed = sum(1 for _, _, status in load.samples if status == PLACED)
    per = round(sum(requests) / len(requests), 2) if requests else None
    step = {
        "rate": rate,
        "seconds": round(seconds, 1),
        "sent": len(load.samples),
        "placed": placed,
        "orders_per_s": round(placed / seconds, 1) if seconds else 0.0,
        "status": {str(code): n for code, n in sorted(load.statuses.items())},
        "errors": dict(load.errors),
        "late_starts": load.late_starts,
        "requests_per_checkout": per,
        "checkout_ms": growth(every, seconds),
        "limits_ms": {
            "p99": round(CHECKOUT_P99_MS * (per or 1.0), 1),
            "growth": round(LATENCY_GROWTH_MS * (per or 1.0), 1),
        },
    }
    step["verdict"] = kept_up(step)
    return step


def _describe(step: dict) -> str:
    lat = step["checkout_ms"]
    return (
        f"{step['rate']:g}/s for {step['seconds']:.0f} s: {step['orders_per_s']} orders/s "
        f"({step['requests_per_checkout']} requests each), checkout p50 {lat['p50']} / p99 "
        f"{lat['p99']} ms (+{lat['growth']}; limits {step['limits_ms']}); {verdict_text(step)}; "
        f"CPU ms per order {step['cpu_ms_per_order']}"
    )


def run(ctx) -> dict:
    ctx = dataclasses.replace(ctx, workers=WEB_WORKERS)  # as many as ours
    rates = list(ctx.oscar_sustained_rates or (QUICK_RATES if ctx.quick else OSCAR_RATES))
    seconds = float(ctx.sustained_seconds or (QUICK_SECONDS if ctx.quick else DEFAULT_SECONDS))
    steps: list[dict] = []
    with contextlib.ExitStack() as stack:
        peer = oscar_peer.start(stack, ctx, prefix="bench-oscar-sustained-", threads=WEB_THREADS)
        base_url, product = peer.server.base_url, peer.products[PRODUCT]
        sources = {
            "web": peer.server.cpu_seconds,
            "postgres": postgres_cpu_source(ctx),
            BACKENDS: backends_cpu_source(ctx, peer.database),
        }
        ctx.log(f"  Oscar on {base_url} ({ctx.workers} workers × {WEB_THREADS} threads)")
        lock = threading.Lock()
        requests: list[int] = []

        def send(n: int) -> int | str:
            answer, count = checkout(base_url, product)
            with lock:
                requests.append(count)
            return answer

        # Warm every worker (imports, templates, connections) before the first step.
        warm = open_loop(send, rate=4, duration=2 * ctx.workers / 4 + 1, max_in_flight=8)
        # A placed order says the flow works; a slow machine's timeouts here are no verdict.
        if PLACED not in warm.statuses or set(warm.statuses) - {PLACED}:
            raise AssertionError(f"warming Oscar: {dict(warm.statuses)} {dict(warm.errors)}")
        for rate in rates:
            requests.clear()
            before = cpu.read(sources)
            load = open_loop(send, rate=rate, duration=seconds, max_in_flight=MAX_IN_FLIGHT)
            step = step_figures(rate=rate, seconds=load.duration_s, load=load, requests=requests)
            step["cpu_s"] = cpu.spent(before, cpu.read(sources))
            step["cpu_ms_per_order"] = cpu.per_unit_ms(step["cpu_s"], step["placed"])
            steps.append(step)
            ctx.log("  " + _describe(step))
            if not step["verdict"]["kept_up"]:
                break
    rate = headline(steps)
    ctx.log(f"  OSCAR SUSTAINED: {rate if rate is not None else 'none'} orders/s")
    return {
        "oscar_sustained_orders_per_s": rate,
        "steps": steps,
        "rates": rates,
        "step_seconds": seconds,
        "web": {"workers": ctx.workers, "threads": WEB_THREADS},
        "criteria": {
            "checkout_p99_ms_per_request": CHECKOUT_P99_MS,
            "checkout_growth_ms_per_request": LATENCY_GROWTH_MS,
            "window_s": window_for(seconds),
        },
        "runs": [
            {
                "label": f"oscar {s['rate']:g}/s",
                "concurrency": MAX_IN_FLIGHT,
                "rps": s["orders_per_s"],
                "requests": s["sent"],
                "latency_ms": {"p50": s["checkout_ms"]["p50"], "p99": s["checkout_ms"]["p99"]},
            }
            for s in steps
        ],
    }
