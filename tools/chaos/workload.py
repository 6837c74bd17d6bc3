"""The chaos run's workload: shoppers, staff and a courier over HTTP, every attempt logged.

Each keyed request is sent 1-3 times with the same Idempotency-Key (some of
the copies concurrently, from threads), to a host picked at random for each
copy; a copy that got no answer, a 5xx or 409 `idempotency_key_in_use` is
sent again a little later, so most keys end with a final answer the
checker can compare the replays against. Every attempt is one line of
`answers.jsonl` (the interface in docs/failure-model.md, "Chaos run").
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import requests

# Test payment methods (contract: the simulated provider) and how often each is used.
PAYMENT_METHODS = (
    ("pm_card_ok", 70),
    ("pm_card_declined", 8),
    ("pm_card_timeout", 8),
    ("pm_card_unavailable", 14),
)
MODES = ("reject", "partial", "ask")
TRACKING_STATUSES = ("label_created", "picked_up", "in_transit", "out_for_delivery", "delivered")
ADDRESS = {
    "name": "Chaos Shopper",
    "line1": "1 Failure Street",
    "city": "Lyon",
    "postal_code": "69001",
    "country": "FR",
}
# Accounts each shopper thread takes turns with, one journey each. The threads
# make the load; the accounts keep each one at a person's pace, so the limits
# per shopper on new orders (docs/checkout.md, "Limits per shopper": 20 a minute,
# 3 awaiting a decision or a payment outcome) are not what the run measures.
ACCOUNTS_PER_SHOPPER = 4
# No answer, a server error or "still running": the same key is sent again later.
RETRYABLE = {None, 500, 502, 503, 504}
HTTP_TIMEOUT = 30.0


@dataclass
class Product:
    sku: str
    price: str
    stock: int


@dataclass
class Answer:
    status: int | None
    body: Any
    replayed: bool
    retry_after: float = 0.0


class AnswerLog:
    """Append one JSON line per HTTP attempt; count answers for the progress line and plot."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("a", encoding="utf8")
        self.lock = threading.Lock()
        self.total = 0
        self.by_status: Counter[str] = Counter()

    def write(self, record: dict) -> None:
        line = json.dumps(record, separators=(",", ":"), default=str)
        with self.lock:
            self.file.write(line + "\n")
            self.file.flush()
            self.total += 1
            status = record["status"]
            self.by_status["none" if status is None else str(status)] += 1

    def snapshot(self) -> tuple[int, dict[str, int]]:
        with self.lock:
            return self.total, dict(self.by_status)

    def close(self) -> None:
        with self.lock:
            self.file.close()


def _server_took(header: str) -> float | None:
    """Seconds from a `Server-Timing: app;dur=<ms>` header; None without one."""
    for metric in header.split(","):
        name, _, dur = metric.strip().partition(";dur=")
        if name == "app":
            try:
                return round(float(dur) / 1000, 3)
            except ValueError:
                return None
    return None


class Client:
    """Send requests as one user to the hosts, logging each attempt."""

    def __init__(
        self,
        *,
        actor: str,
        token: str | None,
        hosts: dict[str, str],
        log: AnswerLog,
        rng: random.Random,
    ) -> None:
        self.actor = actor
        self.token = token
        self.hosts = hosts
        self.log = log
        self.rng = rng
        self.local = threading.local()
        self.retrier: Retrier | None = None

    def _session(self) -> requests.Session:
        session = getattr(self.local, "session", None)
        if session is None:
            session = self.local.session = requests.Session()
        return session

    def send(
        self,
        kind: str,
        method: str,
        path: str,
        *,
        body: Any = None,
        key: str | None = None,
        host: str | None = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Answer:
        """Send one attempt to `host` (default: a random one) and log it."""
        host = host or self.rng.choice(sorted(self.hosts))
        sent_headers = {"Content-Type": "application/json"}
        if self.token:
            sent_headers["Authorization"] = f"Token {self.token}"
        if key is not None:
            sent_headers["Idempotency-Key"] = key
        sent_headers.update(headers or {})
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        started = time.time()
        status: int | None = None
        parsed: Any = None
        replayed = False
        retry_after = 0.0
        server_took: float | None = None
        try:
            response = self._session().request(
                method,
                self.hosts[host] + path,
                data=data,
                headers=sent_headers,
                timeout=HTTP_TIMEOUT,
            )
            status = response.status_code
            replayed = response.headers.get("Idempotent-Replayed", "").lower() == "true"
            try:
                retry_after = float(response.headers.get("Retry-After") or 0)
            except ValueError:
                retry_after = 0.0
            server_took = _server_took(response.headers.get("Server-Timing", ""))
            try:
                parsed = response.json()
            except ValueError:
                parsed = None
        except requests.RequestException:
            # Connection dropped, refused or timed out: the server may have died.
            self.local.session = None
        self.log.write(
            {
                "t": started,
                "host": host,
                "actor": self.actor,
                "kind": kind,
                "method": method,
                "path": path,
                "key": key,
                "status": status,
                "replayed": replayed,
                "body": parsed,
                # How long the answer took (or the attempt, when none came):
                # requests waiting on a hung dependency (docs/failure-model.md).
                "took": round(time.time() - started, 3),
                # How long the server says it had the request (core/deadline.py's
                # Server-Timing, from when it joined the queue for a thread).
                "server_took": server_took,
            }
        )
        return Answer(status, parsed, replayed, retry_after)

    def keyed(
        self,
        kind: str,
        path: str,
        body: Any,
        *,
        stop: threading.Event,
        copies: int | None = None,
        key: str | None = None,
        patience: float = 6.0,
    ) -> Answer:
        """Send one keyed POST 1-3 times (some at once), then again until it has a final answer.

        Return the last final answer (or the last attempt's when none came).
        """
        key = key or f"chaos-{uuid.uuid4()}"
        copies = copies or self.rng.choice((1, 1, 2, 2, 3))
        answers: list[Answer] = []
        concurrent = copies > 1 and self.rng.random() < 0.5
        if concurrent:
            threads = [
                threading.Thread(
                    target=lambda: answers.append(self.send(kind, "POST", path, body=body, key=key))
                )
                for _ in range(copies)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        else:
            for _ in range(copies):
                answers.append(self.send(kind, "POST", path, body=body, key=key))
                if self.rng.random() < 0.3:
                    time.sleep(self.rng.uniform(0, 0.5))
        final = [a for a in answers if _final(a)]
        # Retry a little while in line; a key still open after that (its lock
        # held by a killed process until the TTL) goes to the retrier, which
        # sends it again until its final answer, and the shopper moves on.
        deadline = time.monotonic() + patience
        while not final and time.monotonic() < deadline and not stop.is_set():
            last = answers[-1]
            time.sleep(max(last.retry_after, 1.0) + self.rng.uniform(0, 1.5))
            answers.append(self.send(kind, "POST", path, body=body, key=key))
            if _final(answers[-1]):
                final.append(answers[-1])
        if not final and self.retrier is not None:
            self.retrier.add(self, kind, path, body, key)
        return final[-1] if final else answers[-1]


class Retrier:
    """Send open keys again now and then until each has a final answer (or gives up)."""

    GIVE_UP = 150.0  # seconds; the completer finishes what is left

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.lock = threading.Lock()
        self.items: list[tuple[float, Client, str, str, Any, str]] = []
        self.handed = 0
        self.finished = 0
        self.thread = threading.Thread(target=self._loop, name="retrier", daemon=True)

    def add(self, client: Client, kind: str, path: str, body: Any, key: str) -> None:
        with self.lock:
            self.handed += 1
            self.items.append((time.monotonic() + self.GIVE_UP, client, kind, path, body, key))

    def _loop(self) -> None:
        while not self.stop.wait(3.0):
            with self.lock:
                items, self.items = self.items, []
            keep = []
            for item in items:
                deadline, client, kind, path, body, key = item
                if self.stop.is_set():
                    keep.append(item)
                    continue
                if _final(client.send(kind, "POST", path, body=body, key=key)):
                    self.finished += 1
                elif time.monotonic() < deadline:
                    keep.append(item)
            with self.lock:
                self.items.extend(keep)


def shopper_accounts(accounts: Sequence[tuple[str, str]], threads: int) -> list[list]:
    """Deal the accounts to `threads` shopper threads, round-robin (none left out)."""
    return [list(accounts[index::threads]) for index in range(threads) if accounts[index::threads]]


def _final(answer: Answer) -> bool:
    if answer.status in RETRYABLE:
        return False
    code = answer.body.get("code") if isinstance(answer.body, dict) else None
    return not (answer.status == 409 and code == "idempotency_key_in_use")


def _body_status(answer: Answer) -> str | None:
    return answer.body.get("status") if isinstance(answer.body, dict) else None


@dataclass
class Workload:
    """All actors of one run; `start` runs them in threads until `stop` is set."""

    hosts: dict[str, str]
    log: AnswerLog
    products: Sequence[Product]
    shoppers: list[tuple[str, str]]  # (username, token): every account
    staff_token: str
    courier_token: str
    seed: int
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    resend_webhooks: Callable[[Client], None] | None = None
    counts: Counter[str] = field(default_factory=Counter)
    counts_lock: threading.Lock = field(default_factory=threading.Lock)
    retrier: Retrier | None = None
    threads_of_shoppers: int = 0  # 0: one thread per account

    def count(self, what: str) -> None:
        with self.counts_lock:
            self.counts[what] += 1

    def start(self) -> None:
        self.retrier = Retrier(self.stop)
        self.threads.append(self.retrier.thread)
        threads = self.threads_of_shoppers or len(self.shoppers)
        for index, accounts in enumerate(shopper_accounts(self.shoppers, threads)):
            rng = random.Random(self.seed * 1000 + index)
            shoppers = [
                Client(actor=username, token=token, hosts=self.hosts, log=self.log, rng=rng)
                for username, token in accounts
            ]
            staff = Client(
                actor="staff", token=self.staff_token, hosts=self.hosts, log=self.log, rng=rng
            )
            courier = Client(
                actor="courier", token=self.courier_token, hosts=self.hosts, log=self.log, rng=rng
            )
            for client in (*shoppers, staff, courier):
                client.retrier = self.retrier
            thread = threading.Thread(
                target=self._shopper_loop,
                args=(shoppers, staff, courier, rng),
                name=f"shopper-{accounts[0][0]}",
                daemon=True,
            )
            self.threads.append(thread)
        if self.resend_webhooks is not None:
            rng = random.Random(self.seed * 1000 + 999)
            provider = Client(actor="provider", token=None, hosts=self.hosts, log=self.log, rng=rng)
            self.threads.append(
                threading.Thread(target=self._webhook_loop, args=(provider,), daemon=True)
            )
        for thread in self.threads:
            thread.start()

    def join(self, timeout: float) -> list[str]:
        """Stop the actors; return the names of threads still busy after `timeout`."""
        self.stop.set()
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]

    def _webhook_loop(self, provider: Client) -> None:
        assert self.resend_webhooks is not None
        while not self.stop.wait(provider.rng.uniform(2, 6)):
            try:
                self.resend_webhooks(provider)
            except Exception as exc:  # noqa: BLE001 - a failed resend round is not fatal
                print(f"chaos: webhook resend failed: {exc}", flush=True)

    # -- one shopper ------------------------------------------------------------

    def _shopper_loop(
        self, shoppers: list[Client], staff: Client, courier: Client, rng: random.Random
    ):
        turn = 0
        while not self.stop.is_set():
            shopper = shoppers[turn % len(shoppers)]  # each account in turn: one journey each
            turn += 1
            try:
                self._journey(shopper, staff, courier, rng)
            except Exception as exc:  # noqa: BLE001 - one broken journey must not end the actor
                self.count("journey_error")
                print(f"chaos: {shopper.actor}: journey error {exc!r}", flush=True)
                time.sleep(1)
            self.stop.wait(rng.uniform(0, 0.5))

    def _order_body(self, rng: random.Random) -> dict:
        count = rng.choice((1, 1, 2, 2, 3))
        picked = rng.sample(list(self.products), k=min(count, len(self.products)))
        methods, weights = zip(*PAYMENT_METHODS, strict=True)
        return {
            "lines": [{"sku": p.sku, "quantity": rng.choice((1, 1, 1, 2, 3))} for p in picked],
            "on_shortage": rng.choice(MODES),
            "payment_method": rng.choices(methods, weights=weights)[0],
            "shipping_address": ADDRESS,
        }

    def _journey(self, shopper: Client, staff: Client, courier: Client, rng: random.Random):
        body = self._order_body(rng)
        self.count(f"checkout_{body['on_shortage']}")
        key = f"chaos-{uuid.uuid4()}"
        answer = shopper.keyed("checkout", "/api/v1/orders/", body, stop=self.stop, key=key)
        if answer.status == 429:
            # A limit per shopper (docs/checkout.md): counted, so a run shows if it bit.
            self.count("checkout_throttled")
        status = _body_status(answer)
        if answer.status == 202 and status == "payment_pending":
            # The key stays open: a later retry answers the settled outcome.
            answer = self._settle_by_retry(shopper, "checkout", "/api/v1/orders/", body, key, rng)
            status = _body_status(answer)
        if not isinstance(answer.body, dict) or "id" not in answer.body:
            return
        order_id = answer.body["id"]
        if status == "awaiting_decision":
            choice = rng.random()
            if choice < 0.6:
                self.count("decide_confirm")
                path = f"/api/v1/orders/{order_id}/confirm/"
                ckey = f"chaos-{uuid.uuid4()}"
                answer = shopper.keyed("decide", path, {}, stop=self.stop, key=ckey)
                if _body_status(answer) == "payment_pending":
                    answer = self._settle_by_retry(shopper, "decide", path, {}, ckey, rng)
                status = _body_status(answer)
            elif choice < 0.85:
                self.count("decide_cancel")
                shopper.keyed("cancel", f"/api/v1/orders/{order_id}/cancel/", {}, stop=self.stop)
                return
            else:
                self.count("decide_none")  # left to expire
                return
        if status not in ("confirmed", "partially_confirmed"):
            return
        self._after_confirm(shopper, staff, courier, rng, order_id, answer.body)

    def _settle_by_retry(
        self, client: Client, kind: str, path: str, body: dict, key: str, rng: random.Random
    ) -> Answer:
        """Send the open key again now and then until the payment's outcome is known."""
        answer = Answer(202, None, False)
        for _ in range(6):
            if self.stop.wait(rng.uniform(2, 5)):
                break
            answer = client.keyed(
                kind, path, body, stop=self.stop, key=key, copies=1, patience=30.0
            )
            if _body_status(answer) != "payment_pending":
                break
        return answer

    def _after_confirm(
        self,
        shopper: Client,
        staff: Client,
        courier: Client,
        rng: random.Random,
        order_id: str,
        order: dict,
    ) -> None:
        choice = rng.random()
        if choice < 0.2:
            self.count("cancel_confirmed")
            if rng.random() < 0.5:
                # Goodwill, then the cancellation at once: it waits while that refund
                # is in progress, then refunds the rest (cancelled ⇒ all refunded).
                self.count("refund_before_cancel")
                self._refund(staff, rng, order_id, order, share=rng.choice((0.3, 1.0)))
            shopper.keyed("cancel", f"/api/v1/orders/{order_id}/cancel/", {}, stop=self.stop)
            return
        if choice < 0.35:
            self._refund(staff, rng, order_id, order)
            return
        if choice < 0.45:
            return  # kept as it is
        self.count("shipment")
        answer = staff.keyed(
            "shipment",
            f"/api/v1/orders/{order_id}/shipments/",
            {"carrier": "chaos-post", "tracking_number": uuid.uuid4().hex[:12]},
            stop=self.stop,
        )
        if answer.status != 201 or not isinstance(answer.body, dict):
            return
        self._tracking(courier, rng, answer.body["id"])
        if rng.random() < 0.35:
            # Goodwill before the return: the return's refund is capped at what is
            # still refundable (0.00 after a goodwill of everything) and it completes.
            self.count("refund_before_return")
            self._refund(staff, rng, order_id, order, share=rng.choice((0.3, 0.8, 1.0)))
        if rng.random() < 0.6:
            self._return(shopper, staff, rng, order_id, answer.body)
        if rng.random() < 0.3:
            # Goodwill beside a return, from the same budget (past it: a final 422).
            self._refund(staff, rng, order_id, order)

    def _refund(
        self, staff: Client, rng: random.Random, order_id: str, order: dict, share: float = 1 / 3
    ) -> None:
        """A goodwill refund of up to `share` of the order's total (1.0: half the time all)."""
        total = float(order.get("total") or "0")
        if total < 0.03:
            return
        self.count("refund")
        amount = max(0.01, round(rng.uniform(0.01, total * share), 2))
        if share >= 1.0 and rng.random() < 0.5:
            amount = total
        body = {
            "amount": f"{amount:.2f}",
            "currency": order.get("currency", "EUR"),
            "reason": "goodwill",
        }
        staff.keyed("refund", f"/api/v1/orders/{order_id}/refunds/", body, stop=self.stop)

    def _tracking(self, courier: Client, rng: random.Random, shipment_id: str) -> None:
        """Post the courier's events, some twice and out of order."""
        start = datetime.now(UTC)
        events = [
            {
                "event_id": f"trk-{uuid.uuid4().hex[:16]}",
                "status": status,
                "occurred_at": (start + timedelta(minutes=10 * i)).isoformat(),
                "location": "Lyon hub",
            }
            for i, status in enumerate(TRACKING_STATUSES[: rng.randint(2, len(TRACKING_STATUSES))])
        ]
        sends = events + [e for e in events if rng.random() < 0.4]
        rng.shuffle(sends)
        for event in sends:
            courier.send(
                "courier_event",
                "POST",
                f"/api/v1/shipments/{shipment_id}/tracking-events/",
                body=event,
            )

    def _return(
        self,
        shopper: Client,
        staff: Client,
        rng: random.Random,
        order_id: str,
        shipment: dict,
    ) -> None:
        """Ask for a return of shipped units and receive it twice."""
        lines = [
            {"sku": line["sku"], "quantity": rng.randint(1, line["quantity"])}
            for line in shipment.get("lines", [])
            if line.get("quantity", 0) > 0 and rng.random() < 0.8
        ]
        if not lines:
            return
        self.count("return")
        answer = shopper.keyed(
            "return_request",
            f"/api/v1/orders/{order_id}/returns/",
            {"lines": lines, "reason": "chaos"},
            stop=self.stop,
        )
        if answer.status != 201 or not isinstance(answer.body, dict):
            return  # it may still have been made (a lost answer)
        path = f"/api/v1/returns/{answer.body['id']}/receive/"
        # Received twice: two scans (two keys), each maybe sent more than once.
        staff.keyed("return_receive", path, {}, stop=self.stop)
        self.stop.wait(rng.uniform(0, 1))
        staff.keyed("return_receive", path, {}, stop=self.stop)
