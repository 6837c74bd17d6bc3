"""Request keys on the test-only probe: replay vs first request, keyed vs unkeyed.

The probe (`POST /api/v1/_test/probe/`, docs/idempotency.md) runs two phases
around an outside call; with `SHOP_PROBE_STUB_URL` unset it calls nothing, so
the figures isolate the key machinery. It is mounted by the bench's gunicorn
settings (`tests.support.bench_settings`, the base settings plus the
test-only app); where it is not mounted the scenario records `skipped`.

Three loads per concurrency level:

- `first`: a fresh Idempotency-Key per request (read, claim inside phase 1,
  fencing update per phase, stored answer);
- `replay`: keys finished before the load, sent again (one indexed read, no
  write; every answer must carry `Idempotent-Replayed: true`);
- `unkeyed`: the same work without a key (`/api/v1/_test/probe-unkeyed/`).

Targets (docs/idempotency.md): replay >= 3x first; keyed (first) >= 0.9x
unkeyed. They are reported per level under `ratios`, never asserted.
"""

from __future__ import annotations

import json
import uuid

import requests

from bench.loadgen import Request

NAME = "idempotency"
DESCRIPTION = "probe endpoint: fresh keys vs replays vs the same work unkeyed"
ORDER = 40

PROBE = "/api/v1/_test/probe/"
UNKEYED = "/api/v1/_test/probe-unkeyed/"
BODY = json.dumps({"label": "bench", "amount": 1}).encode()
TARGETS = {"replay_vs_first": 3.0, "keyed_vs_unkeyed": 0.9}
FINISHED_KEYS_PER_USER = 4


def _probe_mounted(ctx, token: str) -> bool:
    response = requests.post(
        ctx.base_url + PROBE,
        data=BODY,
        headers={
            **ctx.auth_headers(token),
            "Content-Type": "application/json",
            "Idempotency-Key": f"bench-check-{uuid.uuid4().hex}",
        },
        timeout=30,
    )
    if response.status_code == 404:
        return False
    response.raise_for_status()
    return True


def run(ctx) -> dict:
    """Load first requests, replays and unkeyed requests at each concurrency level."""
    tokens = ctx.tokens(16)
    if not _probe_mounted(ctx, tokens[0]):
        ctx.log("  probe not mounted: run gunicorn with tests.support.bench_settings")
        return {"skipped": "the probe needs tests.support.bench_settings", "runs": []}
    run_id = uuid.uuid4().hex[:8]
    json_headers = {"Content-Type": "application/json"}

    def token_of(worker: int) -> str:
        return tokens[worker % len(tokens)]

    def fresh(worker: int, seq: int) -> Request:
        headers = {
            **ctx.auth_headers(token_of(worker)),
            **json_headers,
            "Idempotency-Key": f"{run_id}-first-{worker}-{seq}-{uuid.uuid4().hex[:8]}",
        }
        return Request("POST", PROBE, headers, BODY)

    def finished_key(user_index: int, i: int) -> str:
        return f"{run_id}-done-{user_index}-{i}"

    def replay(worker: int, seq: int) -> Request:
        user_index = worker % len(tokens)
        headers = {
            **ctx.auth_headers(tokens[user_index]),
            **json_headers,
            "Idempotency-Key": finished_key(user_index, seq % FINISHED_KEYS_PER_USER),
        }
        return Request("POST", PROBE, headers, BODY)

    def unkeyed(worker: int, seq: int) -> Request:
        return Request(
            "POST", UNKEYED, {**ctx.auth_headers(token_of(worker)), **json_headers}, BODY
        )

    def must_be_replayed(request: Request, response) -> None:
        if response.headers.get("idempotent-replayed") != "true":
            raise AssertionError(f"not a replay: {response.status} {response.body[:200]!r}")

    # The keys the replays send, finished before any load.
    for user_index, token in enumerate(tokens):
        for i in range(FINISHED_KEYS_PER_USER):
            response = requests.post(
                ctx.base_url + PROBE,
                data=BODY,
                headers={
                    **ctx.auth_headers(token),
                    **json_headers,
                    "Idempotency-Key": finished_key(user_index, i),
                },
                timeout=30,
            )
            response.raise_for_status()

    runs = []
    ratios = {}
    for concurrency in ctx.concurrency_levels():
        first = ctx.load(label="first", concurrency=concurrency, factory=fresh, expected=(201,))
        again = ctx.load(
            label="replay",
            concurrency=concurrency,
            factory=replay,
            expected=(201,),
            on_response=must_be_replayed,
        )
        plain = ctx.load(label="unkeyed", concurrency=concurrency, factory=unkeyed, expected=(201,))
        runs += [first, again, plain]
        ratios[str(concurrency)] = {
            "replay_vs_first": round(again["rps"] / first["rps"], 3) if first["rps"] else None,
            "keyed_vs_unkeyed": round(first["rps"] / plain["rps"], 3) if plain["rps"] else None,
        }
        ctx.log(f"  c={concurrency}: {ratios[str(concurrency)]} (targets {TARGETS})")
    return {"runs": runs, "ratios": ratios, "targets": dict(TARGETS)}
