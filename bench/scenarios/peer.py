"""The peer: the same checkout keyed by drf-idempotencykey 0.2.0 instead of ours, beside ours.

One simulator and one gunicorn (bench.gunicorn_settings, which mount the
peer at /api/v1/_bench/orders-peer/, bench/peer.py) serve both endpoints:

- `ours` / `peer` at 4 and 16 in flight (quick: 16), alternated: orders/s
  and gunicorn CPU per order, a fresh key per request;
- `same key x20`: 20 identical requests (one shopper, one key, one body)
  released together by a barrier, per endpoint; then the effects counted in
  the database: orders, reservations, captured payments (charges);
- `crash`: a gunicorn whose failpoint kills the worker (`exit`) once after the
  effects committed and before the answer left, then the same request again
  (up to RETRIES times, 0.5 s apart, as a client retries): what the retries
  answered and how many orders / charges exist. Ours commits the stored
  answer with the last phase's effects, so "after the commit" has one point
  (`bench.before_answer`); the peer stores its answer in a transaction of
  its own after the view, so it has two: before that store
  (`bench.peer.before_save_answer`) and after it (`bench.before_answer`).
  A peer key left without an answer answers 409 "in progress" until it
  expires (60 minutes); `expired retry` then ages that key past its expiry
  (UPDATE created_at, as an hour of waiting would) and retries once more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
import threading
import time
import uuid
from pathlib import Path

import requests as http

from bench.context import cpu_ms_per_request, rps_ratio
from bench.loadgen import Request
from bench.server import Gunicorn
from bench.shop import order_request, simulator

NAME = "peer"
DESCRIPTION = (
    "the checkout keyed by drf-idempotencykey beside ours: orders/s, 20 identical "
    "concurrent requests, a crash between commit and answer"
)
ORDER = 55

LEVELS = (4, 16)
SAME_KEY = 20
RETRIES = 6
OURS = "/api/v1/orders/"
PEER_PATH = "/api/v1/_bench/orders-peer/"  # bench/peer.py, mounted by bench/urls.py


def _request(headers: dict, sku: str, path: str, key: str | None = None) -> Request:
    base = order_request(headers, sku)
    return Request(
        "POST", path, {**base.headers, "Idempotency-Key": key or str(uuid.uuid4())}, base.body
    )


def _effects(user_id: int) -> dict:
    from inventory.models import Reservation
    from orders.models import Order
    from payments.models import Payment

    orders = Order.objects.filter(owner_id=user_id)
    return {
        "orders": orders.count(),
        "reservations": Reservation.objects.filter(order_line__order__owner_id=user_id).count(),
        "charges": Payment.objects.filter(owner_id=user_id, amount_captured__gt=0).count(),
    }


def _send(base_url: str, request: Request, timeout: float = 30) -> tuple[int | str, dict]:
    try:
        answer = http.post(
            base_url + request.path,
            data=request.body,
            headers=dict(request.headers),
            timeout=timeout,
        )
    except http.RequestException as exc:
        return type(exc).__name__, {}
    return answer.status_code, dict(answer.headers)


def _same_key(ctx, base_url: str, path: str) -> dict:
    """SAME_KEY identical requests released together; the effects they left."""
    [token] = ctx.tokens(1)
    user_id = _user_id(token)
    request = _request(ctx.auth_headers(token), ctx.skus[0], path)
    barrier = threading.Barrier(SAME_KEY)
    statuses: list = [None] * SAME_KEY

    def one(i: int) -> None:
        barrier.wait()
        statuses[i] = _send(base_url, request)[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(SAME_KEY)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(0.5)
    final = _send(base_url, request)[0]  # once everything settled: the answer a retry gets
    counts = _effects(user_id)
    return {
        "answers": _histogram(statuses),
        "retry_after_all": final,
        **counts,
        "duplicate_orders": max(0, counts["orders"] - 1),
        "duplicate_charges": max(0, counts["charges"] - 1),
    }


def _crash(ctx, env: dict, path: str, point: str, workdir: Path, *, expire_peer: bool) -> dict:
    """Kill the worker once at `point`, retry the same request; count the effects."""
    faildir = workdir / f"failpoints-{point}-{uuid.uuid4().hex[:6]}"
    faildir.mkdir()
    server = Gunicorn(
        workers=2,
        env={**env, "SHOP_FAILPOINTS": f"{point}=exit@1", "SHOP_FAILPOINTS_DIR": str(faildir)},
        log_path=workdir / f"gunicorn-crash-{point}.log",
    )
    server.start()
    try:
        [token] = ctx.tokens(1)
        user_id = _user_id(token)
        key = str(uuid.uuid4())
        request = _request(ctx.auth_headers(token), ctx.skus[1], path, key)
        first = _send(server.base_url, request)[0]
        retries = []
        for _ in range(RETRIES):
            time.sleep(0.5)
            status, headers = _send(server.base_url, request)
            retries.append(status)
            if status == 201:
                break
        result: dict = {"point": point, "first": first, "retries": retries}
        if expire_peer and retries and retries[-1] != 201:
            from django.db import connection

            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE drf_idempotencykey_idempotencykey"
                    " SET created_at = created_at - interval '61 minutes'"
                    " WHERE key = %s AND user_id = %s",
                    [key, user_id],
                )
            result["expired_retry"] = _send(server.base_url, request)[0]
        counts = _effects(user_id)
        result.update(counts)
        result["duplicate_orders"] = max(0, counts["orders"] - 1)
        result["duplicate_charges"] = max(0, counts["charges"] - 1)
        result["fired"] = len(list(faildir.iterdir()))
        return result
    finally:
        server.stop()


def _user_id(token: str) -> int:
    from core.api_tokens import api_tokens_of

    return api_tokens_of([token]).get().user_id


def _histogram(statuses: list) -> dict:
    counts: dict = {}
    for status in statuses:
        counts[str(status)] = counts.get(str(status), 0) + 1
    return counts


def run(ctx) -> dict:
    tokens = ctx.tokens(16)
    headers = [ctx.auth_headers(token) for token in tokens]
    skus = list(ctx.skus)
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-peer-")))
        provider_url = stack.enter_context(simulator(workdir))
        env = {**ctx.server.env, "PAYMENTS_PROVIDER_URL": provider_url}
        server = Gunicorn(workers=ctx.workers, env=env, log_path=workdir / "gunicorn.log")
        stack.callback(server.stop)
        server.start()
        shop = dataclasses.replace(ctx, base_url=server.base_url, server=server)

        def factory(path: str):
            def make(worker: int, seq: int) -> Request:
                sku = skus[(worker * 7919 + seq) % len(skus)]
                return _request(headers[worker % len(headers)], sku, path)

            return make

        # Warm both endpoints in every worker (imports, pooled connections) before measuring.
        for path in (OURS, PEER_PATH):
            warm = factory(path)
            for i in range(4 * ctx.workers):
                status = _send(server.base_url, warm(i, 0))[0]
                if status != 201:
                    raise AssertionError(f"warming {path} answered {status}")
        runs, ratios = [], {}
        for concurrency in shop.concurrency_levels(LEVELS):
            pair = {}
            for label, path in (("ours", OURS), ("peer", PEER_PATH)):
                pair[label] = shop.load(
                    label=label, concurrency=concurrency, factory=factory(path), expected=(201,)
                )
                runs.append(pair[label])
            ours, peer = pair["ours"], pair["peer"]
            ratios[str(concurrency)] = {
                "peer_vs_ours_orders_per_s": rps_ratio(peer, ours),
                "ours_cpu_ms_per_order": cpu_ms_per_request(ours),
                "peer_cpu_ms_per_order": cpu_ms_per_request(peer),
            }
            ctx.log(f"  c={concurrency}: {ratios[str(concurrency)]}")
        same_key = {
            label: _same_key(ctx, server.base_url, path)
            for label, path in (("ours", OURS), ("peer", PEER_PATH))
        }
        ctx.log(f"  {SAME_KEY} identical requests at once: {json.dumps(same_key)}")
        server.stop()
        crash = {
            "ours": _crash(ctx, env, OURS, "bench.before_answer", workdir, expire_peer=False),
            "peer_before_store": _crash(
                ctx, env, PEER_PATH, "bench.peer.before_save_answer", workdir, expire_peer=True
            ),
            "peer_after_store": _crash(
                ctx, env, PEER_PATH, "bench.before_answer", workdir, expire_peer=True
            ),
        }
        ctx.log(f"  crash between commit and answer, then retries: {json.dumps(crash)}")
    return {"runs": runs, "ratios": ratios, "same_key": same_key, "crash": crash}
