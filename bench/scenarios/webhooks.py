"""Webhook intake: signed provider events per second, fresh ones vs duplicates.

`POST /api/v1/payments/webhooks/` (payments/webhooks.py) at 4 and 16 in
flight, every event correctly signed (`Shop-Signature: t=<unix>,v1=<hex
HMAC-SHA256 of "<t>.<raw body>">`):

- `fresh`: a new `charge.captured` event per request (new event id, new
  provider key and a payment reference the shop does not know), as the
  simulator sends them (`devtools/simulator/webhooks.py`: compact JSON,
  `data` = provider_key, reference, amount, currency, operation_id). The shop
  verifies the signature, parses the body, inserts the inbox row, finds no
  payment with that reference and stores the event `unmatched` (one UPDATE),
  then commits: the whole write path of an event that arrives before the
  shop's own capture record, and a lower bound for one it can apply (which
  adds the payment lock and the capture's transition).
- `duplicate`: `DUPLICATES` events sent (and stored) before the load, sent
  again byte for byte (re-signed per send with the time of that send, as a
  provider signs every retry): signature, parse, the inbox INSERT that fails
  on its unique constraint, rollback, 200 `duplicate`. Nothing is stored; the
  scenario checks that the inbox holds exactly as many rows after the
  duplicate loads as before them.

Every answer must be 200 with the expected `status` (`unmatched` /
`duplicate`), or the run fails. Requests are built per request by the load
generator's factory, so every signature's timestamp is the moment of its
send (well inside the 300 s window).

The harness's gunicorn has no webhook secret (the base settings default to
none, which rejects every webhook), so this scenario starts its own with the
same environment plus a fresh random `PAYMENTS_WEBHOOK_SECRET`, the secret
it signs with; it is stopped at the end whatever happens.

Target: a duplicate costs less than a fresh event, i.e. `duplicate_vs_fresh`
(events/s) > 1 at each level; reported under `ratios` with the gunicorn CPU
per event of both, never asserted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import tempfile
import time
import uuid
from pathlib import Path

import requests as http

from bench.context import cpu_ms_per_request, rps_ratio
from bench.loadgen import Request
from bench.server import Gunicorn

NAME = "webhooks"
DESCRIPTION = "signed POST /payments/webhooks/: fresh charge.captured (unmatched) vs duplicates"
ORDER = 70

PATH = "/api/v1/payments/webhooks/"
LEVELS = (4, 16)
DUPLICATES = 256
TARGETS = {"duplicate_vs_fresh": 1.0}  # a duplicate must cost less: ratio > 1


def event_body(event_id: str, *, created: int | None = None) -> bytes:
    """Return a `charge.captured` event for a payment the shop does not know, as compact JSON."""
    event = {
        "id": event_id,
        "type": "charge.captured",
        "created": int(time.time()) if created is None else created,
        "data": {
            "provider_key": f"bench-{event_id}",
            "reference": f"pay_bench_{event_id}",
            "amount": "19.99",
            "currency": "EUR",
            "operation_id": f"op_{event_id}"[:64],
        },
    }
    return json.dumps(event, separators=(",", ":")).encode()


def signed_request(body: bytes, *, secret: str, now: float | None = None) -> Request:
    """Return the webhook POST of `body`, signed with `secret` at `now` (default: this moment)."""
    from payments.webhooks import SIGNATURE_HEADER, sign

    timestamp = int(time.time() if now is None else now)
    headers = {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: sign(secret=secret, timestamp=timestamp, body=body),
    }
    return Request("POST", PATH, headers, body)


def _expect(status: str):
    def check(request: Request, response) -> None:
        if response.status != 200:
            raise AssertionError(f"webhook answered {response.status}: {response.body[:200]!r}")
        got = json.loads(response.body).get("status")
        if got != status:
            raise AssertionError(f"webhook stored as {got!r}, expected {status!r}")

    return check


def run(ctx) -> dict:
    """Pre-send the duplicates, then load fresh events and duplicates at 4 and 16 in flight."""
    from django.db.models import Count

    from idempotency.models import InboxMessage
    from payments.webhooks import SOURCE

    secret = "whsec_bench_" + secrets.token_hex(16)
    run_id = uuid.uuid4().hex[:8]
    prefix = f"evt_bench_{run_id}_"
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-webhooks-")))
        server = Gunicorn(
            workers=ctx.workers,
            env={**ctx.server.env, "PAYMENTS_WEBHOOK_SECRET": secret},
            log_path=workdir / "gunicorn.log",
        )
        stack.callback(server.stop)
        server.start()
        shop = dataclasses.replace(ctx, base_url=server.base_url, server=server)
        ctx.log(f"  webhook gunicorn (own secret) on {server.base_url}")

        # The events the duplicate loads send again: stored once, before any load.
        stored = [event_body(f"{prefix}dup_{i:04d}") for i in range(DUPLICATES)]
        with http.Session() as session:
            for body in stored:
                request = signed_request(body, secret=secret)
                answer = session.post(
                    server.base_url + PATH, data=body, headers=dict(request.headers), timeout=30
                )
                if answer.status_code != 200 or answer.json().get("status") != "unmatched":
                    detail = f"{answer.status_code}: {answer.text[:200]}"
                    raise AssertionError(f"pre-sending a duplicate answered {detail}")

        def fresh_at(concurrency: int):
            # Event ids unique over the whole run: worker and sequence restart per load.
            def fresh(worker: int, seq: int) -> Request:
                event_id = f"{prefix}c{concurrency}_w{worker}_{seq}"
                return signed_request(event_body(event_id), secret=secret)

            return fresh

        def duplicate(worker: int, seq: int) -> Request:
            return signed_request(stored[(worker * 37 + seq) % len(stored)], secret=secret)

        inbox = InboxMessage.objects.filter(consumer=SOURCE, message_id__startswith=prefix)
        runs, ratios, stored_by_duplicates = [], {}, {}
        for concurrency in shop.concurrency_levels(LEVELS):
            first = shop.load(
                label="fresh",
                concurrency=concurrency,
                factory=fresh_at(concurrency),
                on_response=_expect("unmatched"),
            )
            rows_before = inbox.count()
            again = shop.load(
                label="duplicate",
                concurrency=concurrency,
                factory=duplicate,
                on_response=_expect("duplicate"),
            )
            stored_by_duplicates[str(concurrency)] = inbox.count() - rows_before
            runs += [first, again]
            ratios[str(concurrency)] = {
                "duplicate_vs_fresh": rps_ratio(again, first),
                "fresh_cpu_ms_per_event": cpu_ms_per_request(first),
                "duplicate_cpu_ms_per_event": cpu_ms_per_request(again),
            }
            ctx.log(f"  c={concurrency}: {ratios[str(concurrency)]} (target ratio > 1)")
        if any(stored_by_duplicates.values()):
            raise AssertionError(f"duplicates stored inbox rows: {stored_by_duplicates}")
        statuses = dict(inbox.values_list("status").annotate(n=Count("id")).order_by())
    return {
        "event": "charge.captured for an unknown payment (stored unmatched)",
        "duplicates_pre_sent": DUPLICATES,
        "inbox_rows_by_status": statuses,
        "inbox_rows_stored_by_duplicate_loads": stored_by_duplicates,
        "ratios": ratios,
        "targets": dict(TARGETS),
        "runs": runs,
    }
