"""The simulator's webhook sender: every event at least once, signed, from a background thread.

The queue is the ledger's `events` table, written in the same SQLite
transaction as its operation, so an event survives a restart (or a SIGKILL)
of the simulator and is sent after it, like a real provider's. The thread
sends due rows oldest-due first, one POST each:

    POST <webhook url>
    Content-Type: application/json
    Shop-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">
    {"id": "evt_…", "type": "charge.captured", "created": <unix seconds>,
     "data": {"provider_key", "reference", "amount", "currency", "operation_id"}}

A 2xx answer is a delivery. Anything else (non-2xx, refused connection,
timeout after `timeout` seconds) is retried with capped exponential backoff
and jitter, without end (a real provider gives up after days). Every send —
a retry, a duplicate — is signed again with the time of that send.

Like a real provider, it is only "at least once": with `duplicate_rate` an
event is sent twice (decided when it is queued, durably), and each send
waits a random 0..`max_delay_ms` first, so some events arrive late and out
of order. `paused` holds every send (tests). All three are set at start
(CLI) and changed through the control port (`/_control/faults`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from datetime import datetime
from typing import Any

from .ledger import Ledger

logger = logging.getLogger("devtools.simulator.webhooks")

BACKOFF_BASE = 0.5  # seconds before the first retry
BACKOFF_MAX = 30.0


def sign_webhook(*, secret: str, timestamp: int, body: bytes) -> str:
    """Return the `Shop-Signature` header value for one webhook body."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def retry_delay(attempts: int) -> float:
    """Seconds before the next try after `attempts` failed sends: capped, equal jitter."""
    ceiling = min(BACKOFF_BASE * 2 ** max(attempts - 1, 0), BACKOFF_MAX)
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def event_body(row: dict) -> bytes:
    created = datetime.fromisoformat(row["created_at"].replace("Z", "+00:00"))
    event = {
        "id": row["id"],
        "type": row["type"],
        "created": int(created.timestamp()),
        "data": json.loads(row["payload"]),
    }
    return json.dumps(event, separators=(",", ":")).encode()


class WebhookSender:
    """Deliver the ledger's events to one URL from a daemon thread."""

    def __init__(
        self,
        *,
        ledger: Ledger,
        url: str | None,
        secret: str | None,
        duplicate_rate: float = 0.0,
        max_delay_ms: int = 0,
        timeout: float = 5.0,
    ) -> None:
        self.ledger = ledger
        self.url = url
        self.secret = secret or ""
        self.timeout = timeout
        self.defaults: dict[str, Any] = {
            "duplicate_rate": duplicate_rate,
            "max_delay_ms": max_delay_ms,
        }
        self.duplicate_rate = duplicate_rate
        self.max_delay_ms = max_delay_ms
        self.paused = False
        self.stats: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # -- life -----------------------------------------------------------------

    def start(self) -> None:
        if not self.url:
            logger.info("no webhook URL: events are kept in the ledger, not sent")
            return
        if not self.secret:
            logger.warning("webhook URL without a secret: the shop will reject every event")
        self._thread = threading.Thread(target=self._run, name="webhooks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 2)

    # -- policy (control port) ----------------------------------------------------

    def set_policy(self, body: dict) -> None:
        """Apply `webhook_duplicate_rate`, `webhook_max_delay_ms`, `webhooks_paused` if present."""
        if "webhook_duplicate_rate" in body:
            rate = body["webhook_duplicate_rate"]
            if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
                raise ValueError("webhook_duplicate_rate must be a number in [0, 1]")
            self.duplicate_rate = float(rate)
        if "webhook_max_delay_ms" in body:
            delay = body["webhook_max_delay_ms"]
            if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
                raise ValueError("webhook_max_delay_ms must be an int >= 0")
            self.max_delay_ms = delay
        if "webhooks_paused" in body:
            if not isinstance(body["webhooks_paused"], bool):
                raise ValueError("webhooks_paused must be a boolean")
            self.paused = body["webhooks_paused"]
            self._wake.set()

    def reset(self) -> None:
        self.duplicate_rate = self.defaults["duplicate_rate"]
        self.max_delay_ms = self.defaults["max_delay_ms"]
        self.paused = False
        with self._lock:
            self.stats.clear()
        self._wake.set()

    def state(self) -> dict:
        with self._lock:
            stats = dict(self.stats)
        return {
            "url": self.url,
            "duplicate_rate": self.duplicate_rate,
            "max_delay_ms": self.max_delay_ms,
            "paused": self.paused,
            "stats": stats,
        }

    # -- queue ----------------------------------------------------------------

    def _delay(self) -> float:
        return random.uniform(0, self.max_delay_ms / 1000) if self.max_delay_ms else 0.0

    def notify(self, operation: dict) -> None:
        """A new operation committed (maybe with an event): decide duplication and delay, wake."""
        sends = 2 if self.duplicate_rate and random.random() < self.duplicate_rate else 1
        self.ledger.event_schedule(
            operation_key=operation["key"], sends=sends, next_attempt_at=time.time() + self._delay()
        )
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            due = [] if self.paused else self.ledger.events_due(now=time.time())
            if not due:
                self._wake.wait(0.1)
                self._wake.clear()
                continue
            for row in due:
                if self._stopping.is_set() or self.paused:
                    break
                try:
                    self._send(row)
                except Exception:  # noqa: BLE001 - the thread must outlive any one event
                    logger.exception("webhook %s: sender error", row["id"])
                    self.ledger.event_failed(
                        event_id=row["id"],
                        next_attempt_at=time.time() + retry_delay(row["attempts"] + 1),
                        error="sender error",
                    )

    def _send(self, row: dict) -> None:
        assert self.url is not None  # start() runs the sender only with a URL
        body = event_body(row)
        timestamp = int(time.time())
        request = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": "PaymentSimulator-Webhooks/1",
                "Shop-Signature": sign_webhook(secret=self.secret, timestamp=timestamp, body=body),
            },
        )
        with self._lock:
            self.stats["sent"] += 1
        error = ""
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                status = response.status
                response.read()
        except urllib.error.HTTPError as exc:
            status = exc.code
            error = f"HTTP {exc.code}"
        except (OSError, ValueError) as exc:  # refused, reset, timeout, bad URL
            status = None
            error = f"{type(exc).__name__}: {exc}"
        if status is not None and 200 <= status < 300:
            with self._lock:
                self.stats["delivered"] += 1
                if row["deliveries"] >= 1:
                    self.stats["duplicates"] += 1
                self.stats[f"delivered.{row['type']}"] += 1
            self.ledger.event_delivered(
                event_id=row["id"], next_attempt_at=time.time() + self._delay()
            )
            return
        with self._lock:
            self.stats["failed"] += 1
        logger.info("webhook %s not delivered (%s); retrying", row["id"], error)
        self.ledger.event_failed(
            event_id=row["id"],
            next_attempt_at=time.time() + retry_delay(row["attempts"] + 1),
            error=error,
        )
