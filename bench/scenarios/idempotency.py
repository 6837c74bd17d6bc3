"""Benchmark scenario: request keys on the probe endpoint (not a test; nothing is asserted).

Two comparisons on the same two-phase operation (the test-only probe, so the
server must run with `SHOP_TEST_ENDPOINTS=true`; with `SHOP_PROBE_STUB_URL`
unset the probe makes no outside call, which isolates the key machinery):

1. replay vs first request: throughput of requests with fresh keys (claim,
   two phases, stored answer) against replays of finished keys (one indexed
   read, no write). Target: replay >= 3x first.
2. keyed vs unkeyed: fresh-key requests to `/api/v1/_test/probe/` against
   the same work without a key at `/api/v1/_test/probe-unkeyed/`.
   Target: keyed / unkeyed >= 0.9.

Call `run(base_url)` against a running shop; it registers one shopper,
warms up, then measures each variant for `requests_per_variant` requests
from `concurrency` client threads and returns a dict of figures.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import requests

PROBE = "/api/v1/_test/probe/"
UNKEYED = "/api/v1/_test/probe-unkeyed/"
BODY = {"label": "bench", "amount": 1}

TARGETS = {"replay_vs_first": 3.0, "keyed_vs_unkeyed": 0.9}


def _register(base_url: str) -> str:
    name = f"bench-{uuid.uuid4().hex[:12]}"
    response = requests.post(
        f"{base_url}/api/v1/auth/register/",
        json={"username": name, "email": f"{name}@example.com", "password": uuid.uuid4().hex},
        timeout=30,
    )
    response.raise_for_status()
    return response.json()["token"]


def _measure(*, total: int, concurrency: int, send: Callable[[requests.Session, int], int]) -> dict:
    """Send `total` requests from `concurrency` threads; return throughput and error count."""
    counter = iter(range(total))
    lock = threading.Lock()
    errors: list[int] = []
    latencies: list[float] = []
    barrier = threading.Barrier(concurrency + 1)

    def worker() -> None:
        session = requests.Session()
        barrier.wait()
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            started = time.perf_counter()
            try:
                status = send(session, i)
            except requests.RequestException:
                status = 0
            elapsed = time.perf_counter() - started
            with lock:
                latencies.append(elapsed)
                if status not in (200, 201):
                    errors.append(status)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "requests": total,
        "seconds": round(elapsed, 3),
        "rps": round(total / elapsed, 1) if elapsed else 0.0,
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 2) if latencies else None,
        "p95_ms": round(latencies[int(len(latencies) * 0.95)] * 1000, 2) if latencies else None,
        "errors": len(errors),
    }


def run(
    base_url: str,
    *,
    requests_per_variant: int = 400,
    concurrency: int = 8,
    replay_keys: int = 20,
    warmup: int = 40,
) -> dict:
    """Measure replay-vs-first and keyed-vs-unkeyed throughput of the probe; return the figures.

    Returns {"first": {...}, "replay": {...}, "keyed": {...}, "unkeyed": {...},
    "ratios": {"replay_vs_first": x, "keyed_vs_unkeyed": y}, "targets": {...},
    "met": {"replay_vs_first": bool, "keyed_vs_unkeyed": bool}}; each variant
    has requests, seconds, rps, p50_ms, p95_ms and errors.
    """
    base_url = base_url.rstrip("/")
    token = _register(base_url)
    auth = {"Authorization": f"Token {token}"}
    run_id = uuid.uuid4().hex[:8]

    def keyed(prefix: str) -> Callable[[requests.Session, int], int]:
        def send(session: requests.Session, i: int) -> int:
            headers = {**auth, "Idempotency-Key": f"{run_id}-{prefix}-{i}"}
            return session.post(
                base_url + PROBE, json=BODY, headers=headers, timeout=30
            ).status_code

        return send

    def replay(session: requests.Session, i: int) -> int:
        headers = {**auth, "Idempotency-Key": f"{run_id}-finished-{i % replay_keys}"}
        response = session.post(base_url + PROBE, json=BODY, headers=headers, timeout=30)
        return response.status_code if response.headers.get("Idempotent-Replayed") else -1

    def unkeyed(session: requests.Session, i: int) -> int:
        return session.post(base_url + UNKEYED, json=BODY, headers=auth, timeout=30).status_code

    # Warm every worker's connection pool and code paths; create the keys replays use.
    _measure(total=warmup, concurrency=concurrency, send=keyed("warm"))
    _measure(total=warmup, concurrency=concurrency, send=unkeyed)
    _measure(total=replay_keys, concurrency=concurrency, send=keyed("finished"))

    results = {
        "first": _measure(total=requests_per_variant, concurrency=concurrency, send=keyed("first")),
        "replay": _measure(total=requests_per_variant, concurrency=concurrency, send=replay),
        "unkeyed": _measure(total=requests_per_variant, concurrency=concurrency, send=unkeyed),
        "keyed": _measure(total=requests_per_variant, concurrency=concurrency, send=keyed("keyed")),
    }

    def ratio(a: str, b: str) -> float:
        return round(results[a]["rps"] / results[b]["rps"], 3) if results[b]["rps"] else 0.0

    ratios = {
        "replay_vs_first": ratio("replay", "first"),
        "keyed_vs_unkeyed": ratio("keyed", "unkeyed"),
    }
    return {
        **results,
        "ratios": ratios,
        "targets": dict(TARGETS),
        "met": {name: ratios[name] >= target for name, target in TARGETS.items()},
        "settings": {
            "requests_per_variant": requests_per_variant,
            "concurrency": concurrency,
            "replay_keys": replay_keys,
        },
    }


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"), indent=2))
