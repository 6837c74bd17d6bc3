"""Memory: peak RSS of a gunicorn worker and a Celery worker across 10,000 checkouts.

Its own simulator, gunicorn (4 sync workers, no max_requests: a worker is
never recycled, so a leak would show), outbox relay and Celery worker
(`--concurrency 2`, prefork, as the relay scenario runs it), so the
checkouts' outbox messages are published and consumed (loyalty points,
purchase history) while they are placed. `--rss-checkouts` (10,000) keyed orders at 4 in
flight, in loads of CHUNK (each load is bounded by the load generator's
time cap); a sampler thread reads every process's RSS (psutil) every
SAMPLE_S seconds beside the number of checkouts answered so far.

Reported: the peak RSS of any gunicorn worker and of any Celery process,
and the slope of a least-squares line through each series after the first
WARM_SHARE of the checkouts, in MB per 1,000 checkouts. Flat = the line
rises by less than FLAT_MB over the whole run after warm-up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time
import uuid

import psutil

from bench import processes
from bench.shop import order_request, shop_with_provider

NAME = "rss"
DESCRIPTION = "peak RSS of a gunicorn worker and a Celery worker across 10,000 checkouts"
ORDER = 95

CHUNK = 2_500  # checkouts per load (ctx.rss_checkouts in all: 10,000; --quick 600)
CONCURRENCY = 4
SAMPLE_S = 1.0
WARM_SHARE = 0.1
FLAT_MB = 2.0


def _rss_mb(proc: psutil.Process) -> float | None:
    try:
        return proc.memory_info().rss / 2**20
    except psutil.Error:
        return None


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    if not var:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / var


def run(ctx) -> dict:
    total = ctx.rss_checkouts
    tokens = ctx.tokens(50)
    headers = [ctx.auth_headers(token) for token in tokens]
    skus = list(ctx.skus)
    done = [0]
    samples: list[dict] = []
    with contextlib.ExitStack() as stack:
        workdir, _, server = shop_with_provider(stack, ctx, prefix="bench-rss-")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "DB_POOL": "true"}
        worker = processes.spawn(
            [sys.executable, "-m", "celery", "-A", "config", "worker", "--concurrency", "2"]
            + ["--loglevel", "warning", "--without-gossip", "--without-mingle"]
            + ["--without-heartbeat", "--hostname", f"bench-rss-{uuid.uuid4().hex[:6]}@%h"],
            env,
            workdir / "worker.log",
        )
        stack.callback(processes.stop, worker)
        relay = processes.spawn(
            [sys.executable, "manage.py", "relay_outbox"], env, workdir / "relay.log"
        )
        stack.callback(processes.stop, relay)
        shop = dataclasses.replace(ctx, base_url=server.base_url, server=server)
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(SAMPLE_S):
                web = [_rss_mb(p) for p in _children(server.proc.pid)] if server.proc else []
                celery = [_rss_mb(psutil.Process(worker.pid))] + [
                    _rss_mb(p) for p in _children(worker.pid)
                ]
                web = [v for v in web if v is not None]
                celery = [v for v in celery if v is not None]
                if web and celery:
                    samples.append(
                        {
                            "t": round(time.monotonic() - started, 2),
                            "checkouts": done[0],
                            "gunicorn_worker_max_mb": round(max(web), 2),
                            "celery_max_mb": round(max(celery), 2),
                        }
                    )

        def order(worker_index: int, seq: int):
            return order_request(
                headers[(worker_index * 13 + seq) % len(headers)], skus[seq % len(skus)]
            )

        def count(request, response) -> None:
            done[0] += 1

        # Warm every worker before sampling (imports, pooled connections).
        shop.load(
            label="warm",
            concurrency=CONCURRENCY,
            factory=order,
            max_requests=8 * ctx.workers,
            warmup=0,
            expected=(201,),
        )
        time.sleep(1)
        started = time.monotonic()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        runs = []
        try:
            left = total
            while left > 0:
                chunk = min(CHUNK, left)
                runs.append(
                    shop.load(
                        label=f"checkouts {total - left + 1}-{total - left + chunk}",
                        concurrency=CONCURRENCY,
                        factory=order,
                        max_requests=chunk,
                        warmup=0,
                        expected=(201,),
                        on_response=count,
                    )
                )
                left -= chunk
                ctx.log(f"  {done[0]:,} / {total:,} checkouts; last sample {samples[-1:]}")
            time.sleep(5)  # the tasks they caused drain
        finally:
            stop.set()
            sampler.join(10)
    warm = WARM_SHARE * total
    result: dict = {
        "checkouts": done[0],
        "samples": samples,
        "runs": runs,
        "criterion": f"flat: the fitted line rises < {FLAT_MB} MB over the run after the "
        f"first {int(WARM_SHARE * 100)} % of checkouts",
    }
    for series in ("gunicorn_worker_max_mb", "celery_max_mb"):
        points = [(s["checkouts"], s[series]) for s in samples if s["checkouts"] >= warm]
        slope = _slope(points)
        rise = slope * (total - warm) if slope is not None else None
        result[series.replace("_mb", "")] = {
            "peak_mb": max((s[series] for s in samples), default=None),
            "first_mb": samples[0][series] if samples else None,
            "last_mb": samples[-1][series] if samples else None,
            "slope_mb_per_1000_checkouts": round(1000 * slope, 3) if slope is not None else None,
            "fitted_rise_mb": round(rise, 2) if rise is not None else None,
            "flat": rise is not None and rise < FLAT_MB,
        }
    ctx.log(f"  RSS: gunicorn {result['gunicorn_worker_max']}, celery {result['celery_max']}")
    return result
