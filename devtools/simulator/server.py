"""The simulated payment provider: an HTTP server with real faults.

API (JSON; every POST needs an `Idempotency-Key` header, at most 255 chars):

    POST /v1/authorizations {amount, currency, payment_method, reference}
    POST /v1/captures       {amount, currency, reference, payment_method}       direct charge
                            {amount, currency, reference, authorization_key}    capture a hold
    POST /v1/voids          {authorization_key, reference}
    POST /v1/refunds        {capture_key, amount, currency, reference}
    GET  /v1/operations?key=K                      look an earlier call up by its key
    GET  /v1/ledger?key_prefix=P&after=SEQ&limit=N every stored operation, in order
    GET  /healthz

Answers: 201 a new succeeded operation, 200 a replay (`Idempotent-Replayed:
true`), 402 declined (stored, replayed like a success), 400 invalid (nothing
stored), 409 `idempotency_key_in_use` (the same key is being processed right
now), 422 `idempotency_key_reused` (same key, other parameters), 503
`unavailable`, 404 unknown key on look-up.

Control API for tests (served on the control port, which stays up while the
API port refuses connections):

    GET  /_control/state
    POST /_control/faults  {latency_ms, pause: "before_apply"|"after_apply"|null,
                            refuse_connections: bool,
                            reject_lookups: 400|401|403|404|null,
                            reject_calls: 400|401|403|404|null,
                            webhook_duplicate_rate: 0..1, webhook_max_delay_ms: int,
                            webhooks_paused: bool,
                            decline_refunds: bool,
                            capture_amount_delta: "0.50"|"-0.50"|null} (any subset)
                           decline_refunds: every new refund is declined
                           (402, decline_code `refund_declined`), stored like one
                           capture_amount_delta: every new direct charge captures
                           the amount asked plus this (a provider that captures
                           another amount than the one asked), stored like one
    GET  /_control/webhooks every stored webhook event and its delivery state
    POST /_control/release  wake every paused request and clear `pause`
    POST /_control/reset    clear faults and counters (never the ledger)
"""

from __future__ import annotations

import json
import logging
import os
import queue
import select
import socket
import threading
import time
from collections import Counter
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from .ledger import Ledger, RequestError, fingerprint, parse_amount
from .webhooks import WebhookSender, sign_webhook  # noqa: F401 - sign_webhook: re-exported

logger = logging.getLogger("devtools.simulator")

METHODS = ("pm_card_ok", "pm_card_declined", "pm_card_timeout", "pm_card_unavailable")
UNAVAILABLE_ATTEMPTS = 2
PAUSE_POINTS = ("before_apply", "after_apply")
# What stands between the shop and the provider can answer for it: a rotated
# API key (401), a firewall (403), a proxy refusing the request (400), a
# misrouted path (404 with no provider body). None of these come from the
# ledger, so none of them says anything about the operation under the key.
REJECTIONS = {
    400: {"code": "invalid_request", "detail": "rejected before reaching the provider"},
    401: {"code": "unauthorized", "detail": "invalid API key"},
    403: {"code": "forbidden", "detail": "this client may not call the provider"},
    404: None,  # bare: a plain-text body, no provider code
}
ROUTES = {
    "/v1/authorizations": "authorize",
    "/v1/captures": "capture",
    "/v1/voids": "void",
    "/v1/refunds": "refund",
}
PARENT_FIELD = {
    "capture": "authorization_key",
    "void": "authorization_key",
    "refund": "capture_key",
}


class Reply:
    """An HTTP answer, or none at all (`lost=True`: the connection is dropped)."""

    def __init__(
        self, status: int = 200, body: dict | None = None, headers=None, lost=False, raw=None
    ):
        self.status = status
        self.body = body or {}
        self.headers = headers or {}
        self.lost = lost
        self.raw = raw  # bytes sent as text/plain instead of the JSON body


def rejection(status: int) -> Reply:
    """Answer as something in front of the provider would (see REJECTIONS)."""
    body = REJECTIONS[status]
    if body is None:
        return Reply(status, raw=b"404 page not found\n")
    return Reply(status, dict(body))


def error(status: int, code: str, detail: str, **headers) -> Reply:
    return Reply(status, {"code": code, "detail": detail}, headers)


class PooledHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer whose connections are served by threads kept for the next one.

    A thread per connection, as ThreadingHTTPServer, but a thread that has
    served one waits for the next instead of ending: its SQLite connection
    (the ledger's, one per thread) and its start-up are paid once, not per
    call. No connection waits for a thread: with none idle, a new one starts
    (a paused call holds its thread as before).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._idle_lock = threading.Lock()
        self._idle = 0
        self._pool_threads = 0

    def process_request(self, request, client_address) -> None:
        with self._idle_lock:
            start = self._idle == 0
            if start:
                self._pool_threads += 1
            else:
                self._idle -= 1
        self._jobs.put((request, client_address))
        if start:
            threading.Thread(target=self._serve_jobs, daemon=True).start()

    def _serve_jobs(self) -> None:
        while (job := self._jobs.get()) is not None:
            self.process_request_thread(*job)
            with self._idle_lock:
                self._idle += 1

    def server_close(self) -> None:
        super().server_close()
        with self._idle_lock:
            threads, self._pool_threads, self._idle = self._pool_threads, 0, 0
        for _ in range(threads):
            self._jobs.put(None)


class Simulator:
    """One provider: a ledger, fault switches, and the two listening servers."""

    def __init__(
        self,
        *,
        db_path: str,
        host: str = "127.0.0.1",
        hold_seconds: float = 120.0,
        webhook_url: str | None = None,
        webhook_secret: str | None = None,
        webhook_duplicate_rate: float = 0.0,
        webhook_max_delay_ms: int = 0,
        webhook_timeout: float = 5.0,
    ) -> None:
        self.ledger = Ledger(db_path)
        self.host = host
        self.hold_seconds = hold_seconds
        self.webhooks = WebhookSender(
            ledger=self.ledger,
            url=webhook_url,
            secret=webhook_secret,
            duplicate_rate=webhook_duplicate_rate,
            max_delay_ms=webhook_max_delay_ms,
            timeout=webhook_timeout,
        )
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()
        self._release = threading.Event()
        self.latency_ms = 0
        self.pause: str | None = None
        self.reject_lookups: int | None = None
        self.reject_calls: int | None = None
        self.decline_refunds = False
        self.capture_amount_delta: Decimal | None = None
        self.paused = 0
        self.delayed = 0  # calls sleeping in injected latency right now
        self.stats: Counter[str] = Counter()
        self.api_server: ThreadingHTTPServer | None = None
        self.api_port = 0
        self.control_server: ThreadingHTTPServer | None = None
        self.control_port = 0

    # -- servers -------------------------------------------------------------

    def start(self, *, port: int, control_port: int = 0) -> None:
        self.control_server = self._serve(control_port, control_only=True)
        self.control_port = self.control_server.server_address[1]
        self.api_port = port
        self.start_api()
        self.webhooks.start()

    def _serve(self, port: int, *, control_only: bool) -> ThreadingHTTPServer:
        server = PooledHTTPServer((self.host, port), Handler)
        server.simulator = self  # type: ignore[attr-defined]
        server.control_only = control_only  # type: ignore[attr-defined]
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        ).start()
        return server

    def start_api(self) -> None:
        with self._lock:
            if self.api_server is None:
                self.api_server = self._serve(self.api_port, control_only=False)
                self.api_port = self.api_server.server_address[1]

    def stop_api(self) -> None:
        """Close the API listening socket: new connections are refused (ECONNREFUSED)."""
        with self._lock:
            server, self.api_server = self.api_server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def stop(self) -> None:
        self.stopping.set()
        self.release()
        self.webhooks.stop()
        self.stop_api()
        if self.control_server is not None:
            self.control_server.shutdown()
            self.control_server.server_close()

    # -- faults ----------------------------------------------------------------

    def set_faults(self, body: dict) -> dict:
        if "latency_ms" in body:
            latency = body["latency_ms"]
            if not isinstance(latency, int) or latency < 0:
                raise RequestError(400, "invalid_request", "latency_ms must be an int >= 0")
            self.latency_ms = latency
        if "pause" in body:
            if body["pause"] not in (*PAUSE_POINTS, None):
                raise RequestError(400, "invalid_request", f"pause must be one of {PAUSE_POINTS}")
            with self._lock:
                self.pause = body["pause"]
        for fault in ("reject_lookups", "reject_calls"):
            if fault in body:
                if body[fault] is not None and body[fault] not in REJECTIONS:
                    raise RequestError(
                        400, "invalid_request", f"{fault} must be one of {sorted(REJECTIONS)}"
                    )
                with self._lock:
                    setattr(self, fault, body[fault])
        try:
            self.webhooks.set_policy(body)
        except ValueError as exc:
            raise RequestError(400, "invalid_request", str(exc)) from exc
        if "decline_refunds" in body:
            if not isinstance(body["decline_refunds"], bool):
                raise RequestError(400, "invalid_request", "decline_refunds must be a boolean")
            with self._lock:
                self.decline_refunds = body["decline_refunds"]
        if "capture_amount_delta" in body:
            delta = body["capture_amount_delta"]
            try:
                parsed = None if delta is None else Decimal(delta)
            except (ArithmeticError, TypeError, ValueError) as exc:
                raise RequestError(
                    400, "invalid_request", "capture_amount_delta: a decimal string or null"
                ) from exc
            if parsed is not None and not parsed.is_finite():
                raise RequestError(400, "invalid_request", "capture_amount_delta must be finite")
            with self._lock:
                self.capture_amount_delta = parsed or None
        if "refuse_connections" in body:
            if body["refuse_connections"]:
                self.stop_api()
            else:
                self.start_api()
        return self.state()

    def release(self) -> None:
        with self._lock:
            self.pause = None
            event, self._release = self._release, threading.Event()
        event.set()

    def reset(self) -> dict:
        self.release()
        self.latency_ms = 0
        self.start_api()
        with self._lock:
            self.reject_lookups = None
            self.reject_calls = None
            self.decline_refunds = False
            self.capture_amount_delta = None
            self.stats.clear()
        self.webhooks.reset()
        return self.state()

    def state(self) -> dict:
        ledger = self.ledger.counts()
        with self._lock:
            return {
                "pid": os.getpid(),
                "port": self.api_port,
                "control_port": self.control_port,
                "latency_ms": self.latency_ms,
                "pause": self.pause,
                "reject_lookups": self.reject_lookups,
                "reject_calls": self.reject_calls,
                "decline_refunds": self.decline_refunds,
                "capture_amount_delta": str(self.capture_amount_delta)
                if self.capture_amount_delta is not None
                else None,
                "paused": self.paused,
                "delayed": self.delayed,
                "refusing": self.api_server is None,
                "in_flight": sorted(self._in_flight),
                "stats": dict(self.stats),
                "ledger": ledger,
                "webhooks": self.webhooks.state(),
            }

    def _maybe_pause(self, point: str) -> None:
        with self._lock:
            if self.pause != point:
                return
            self.paused += 1
            event = self._release
        try:
            while not event.wait(0.1):
                if self.stopping.is_set():
                    return
        finally:
            with self._lock:
                self.paused -= 1

    def _hold(self, sock: socket.socket) -> None:
        """Keep the connection open without answering until the client gives up."""
        deadline = time.monotonic() + self.hold_seconds
        while time.monotonic() < deadline and not self.stopping.is_set():
            readable, _, _ = select.select([sock], [], [], 0.1)
            if readable:
                try:
                    if not sock.recv(1, socket.MSG_PEEK):
                        return
                except OSError:
                    return

    # -- the API -------------------------------------------------------------

    def validate(self, kind: str, body: dict) -> dict:
        """Return the normalised parameters of a call (what its fingerprint covers)."""
        params: dict = {}
        reference = body.get("reference")
        if not isinstance(reference, str) or not 0 < len(reference) <= 200:
            raise RequestError(400, "invalid_request", "reference: a string of 1..200 chars")
        params["reference"] = reference
        parent_field = PARENT_FIELD.get(kind)
        parent = body.get(parent_field) if parent_field else None
        if kind in ("void", "refund") and not isinstance(parent, str):
            raise RequestError(400, "invalid_request", f"{parent_field} is required")
        if parent is not None:
            if not isinstance(parent, str):
                raise RequestError(400, "invalid_request", f"{parent_field} must be a string")
            params[parent_field] = parent
        method = body.get("payment_method")
        if kind == "authorize" or (kind == "capture" and parent is None):
            if method not in METHODS:
                raise RequestError(
                    400, "invalid_payment_method", f"payment_method must be one of {METHODS}"
                )
            params["payment_method"] = method
        elif method is not None:
            raise RequestError(400, "invalid_request", f"payment_method not allowed with {kind}")
        if kind != "void":
            currency = body.get("currency")
            if not (isinstance(currency, str) and len(currency) == 3 and currency.isupper()):
                raise RequestError(400, "invalid_request", "currency: three capital letters")
            params["currency"] = currency
            params["amount"] = str(parse_amount(body.get("amount"), currency))
        return params

    def execute(self, kind: str, key: str, params: dict, sock: socket.socket) -> Reply:
        """Run one mutating call under its idempotency key."""
        if self.latency_ms:
            with self._lock:
                self.delayed += 1
            try:
                time.sleep(self.latency_ms / 1000)
            finally:
                with self._lock:
                    self.delayed -= 1
        fp = fingerprint(kind, params)
        with self._lock:
            self.stats["requests"] += 1
            if key in self._in_flight:
                self.stats["in_use_conflicts"] += 1
                return error(
                    409,
                    "idempotency_key_in_use",
                    "a call with this key is in progress",
                    **{"Retry-After": "1"},
                )
            stored = self.ledger.get(key)
            if stored is None:
                self._in_flight.add(key)
        if stored is not None:
            if stored.pop("fingerprint") != fp or stored["kind"] != kind:
                with self._lock:
                    self.stats["key_reused"] += 1
                return error(
                    422, "idempotency_key_reused", "this key was used with other parameters"
                )
            with self._lock:
                self.stats["replays"] += 1
            status = 402 if stored["status"] == "declined" else 200
            return Reply(status, stored, {"Idempotent-Replayed": "true"})
        try:
            parent_key = params.get(PARENT_FIELD.get(kind, ""), None)
            method = params.get("payment_method") or self._inherited_method(parent_key)
            if method == "pm_card_unavailable":
                if self.ledger.count_attempt(key) <= UNAVAILABLE_ATTEMPTS:
                    with self._lock:
                        self.stats["unavailable"] += 1
                    return error(503, "unavailable", "the provider is unavailable, try again")
            self._maybe_pause("before_apply")
            declined = method == "pm_card_declined" and parent_key is None
            decline_code = "card_declined" if declined else None
            if kind == "refund" and self.decline_refunds:
                declined, decline_code = True, "refund_declined"
            amount = Decimal(params["amount"]) if "amount" in params else None
            with self._lock:
                delta = self.capture_amount_delta
            if kind == "capture" and parent_key is None and amount is not None and delta:
                # Another amount than the one asked (never below one minor unit).
                unit = Decimal(1).scaleb(int(amount.as_tuple().exponent))
                amount = max((amount + delta).quantize(unit), unit)
            op, new = self.ledger.apply(
                key=key,
                kind=kind,
                fp=fp,
                status="declined" if declined else "succeeded",
                amount=amount,
                currency=params.get("currency"),
                payment_method=method,
                reference=params["reference"],
                parent_key=parent_key,
                decline_code=decline_code,
            )
        finally:
            with self._lock:
                self._in_flight.discard(key)
        op.pop("fingerprint")
        if new:
            with self._lock:
                self.stats[f"applied.{kind}.{op['status']}"] += 1
            self.webhooks.notify(op)
        self._maybe_pause("after_apply")
        if method == "pm_card_timeout" and new:
            # The money moved; the answer is lost. Only the first call per key:
            # a retry under the same key gets the stored answer.
            with self._lock:
                self.stats["answers_lost"] += 1
            self._hold(sock)
            return Reply(lost=True)
        return Reply(402 if op["status"] == "declined" else 201, op)

    def _inherited_method(self, parent_key: str | None) -> str | None:
        if parent_key is None:
            return None
        parent = self.ledger.get(parent_key)
        return parent["payment_method"] if parent else None

    def rejected(self, fault: str) -> Reply | None:
        """Return the injected rejection for this kind of call, if one is set (counted)."""
        with self._lock:
            status = getattr(self, fault)
            if status is None:
                return None
            self.stats[f"{fault}.{status}"] += 1
        return rejection(status)

    def lookup(self, key: str) -> Reply:
        with self._lock:
            self.stats["lookups"] += 1
            if key in self._in_flight:
                return error(
                    409,
                    "idempotency_key_in_use",
                    "a call with this key is in progress",
                    **{"Retry-After": "1"},
                )
        op = self.ledger.get(key)
        if op is None:
            return error(404, "not_found", "no operation with this key")
        op.pop("fingerprint")
        return Reply(200, op)


class Handler(BaseHTTPRequestHandler):
    server_version = "PaymentSimulator/1"
    protocol_version = "HTTP/1.0"  # one request per connection: a lost answer is a lost connection

    @property
    def sim(self) -> Simulator:
        return self.server.simulator  # type: ignore[attr-defined]

    def log_message(self, format, *args):  # noqa: A002 - BaseHTTPRequestHandler's signature
        logger.debug("%s - %s", self.address_string(), format % args)

    def _send(self, reply: Reply) -> None:
        if reply.lost:
            self.close_connection = True
            return
        if reply.raw is not None:
            payload, content_type = reply.raw, "text/plain"
        else:
            payload, content_type = json.dumps(reply.body).encode(), "application/json"
        self.send_response(reply.status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def _body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError as exc:
            raise RequestError(400, "malformed_json", "the body is not JSON") from exc
        if not isinstance(body, dict):
            raise RequestError(400, "invalid_request", "the body must be a JSON object")
        return body

    def do_GET(self):  # noqa: N802 - http.server's naming
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            self._send(self._get(url.path, query))
        except RequestError as exc:
            self._send(error(exc.status, exc.code, exc.detail))

    def _get(self, path: str, query: dict) -> Reply:
        if path == "/_control/state":
            return Reply(200, self.sim.state())
        if path == "/_control/webhooks":
            events = self.sim.ledger.events_list(operation_key=query.get("key"))
            return Reply(200, {"results": events})
        if self.server.control_only:  # type: ignore[attr-defined]
            return error(404, "not_found", "the control port serves /_control/ only")
        if path == "/healthz":
            return Reply(200, {"status": "ok"})
        if path == "/v1/operations":
            if (rejected := self.sim.rejected("reject_lookups")) is not None:
                return rejected
            key = query.get("key")
            if not key:
                raise RequestError(400, "invalid_request", "key is required")
            return self.sim.lookup(key)
        if path == "/v1/ledger":
            try:
                after = int(query.get("after", 0))
                limit = min(max(int(query.get("limit", 500)), 1), 1000)
            except ValueError as exc:
                raise RequestError(400, "invalid_request", "after/limit are integers") from exc
            ops = self.sim.ledger.list(
                key_prefix=query.get("key_prefix", ""), after=after, limit=limit
            )
            for op in ops:
                op.pop("fingerprint")
            next_after = ops[-1]["seq"] if len(ops) == limit else None
            return Reply(200, {"results": ops, "next_after": next_after})
        return error(404, "not_found", f"no route {path}")

    def do_POST(self):  # noqa: N802
        path = urlsplit(self.path).path
        try:
            body = self._body()
            if path.startswith("/_control/"):
                self._send(self._control(path, body))
                return
            if self.server.control_only:  # type: ignore[attr-defined]
                raise RequestError(404, "not_found", "the control port serves /_control/ only")
            kind = ROUTES.get(path)
            if kind is None:
                raise RequestError(404, "not_found", f"no route {path}")
            if (rejected := self.sim.rejected("reject_calls")) is not None:
                self._send(rejected)  # turned away in front of the provider: nothing applied
                return
            key = self.headers.get("Idempotency-Key")
            if not key or len(key) > 255:
                raise RequestError(
                    400, "missing_idempotency_key", "Idempotency-Key: 1..255 characters"
                )
            params = self.sim.validate(kind, body)
            self._send(self.sim.execute(kind, key, params, self.connection))
        except RequestError as exc:
            self._send(error(exc.status, exc.code, exc.detail))
        except Exception:
            logger.exception("internal error on %s", path)
            self._send(error(500, "internal_error", "the provider failed"))

    def _control(self, path: str, body: dict) -> Reply:
        if path == "/_control/faults":
            return Reply(200, self.sim.set_faults(body))
        if path == "/_control/release":
            self.sim.release()
            return Reply(200, self.sim.state())
        if path == "/_control/reset":
            return Reply(200, self.sim.reset())
        return error(404, "not_found", f"no route {path}")
