"""Test support for payments: the simulator as a real process, settlement, reconciliation.

Used by the payments and checkout tests; lives in the test-support package so
no test package imports another's conftest.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

import requests
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.models.functions import Now

from runner.processes import die_with_parent

ROOT = Path(__file__).resolve().parents[2]


class Simulator:
    """A `python -m devtools.simulator` process on a free port, with its ledger file."""

    def __init__(self, workdir: Path, *, webhook_url: str | None = None) -> None:
        self.workdir = workdir
        # Where its webhooks go (None: kept in the ledger, not sent); may be
        # changed before a restart. Signed with the test settings' secret.
        self.webhook_url = webhook_url
        self.db_path = workdir / "simulator.sqlite3"
        self.port = 0
        self.control_port = 0
        self.proc: subprocess.Popen | None = None
        self._starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def control_url(self) -> str:
        return f"http://127.0.0.1:{self.control_port}/_control"

    def start(self) -> Simulator:
        """Start the process (again on the same port and ledger after a kill)."""
        self._starts += 1
        for _ in range(20):
            log = open(self.workdir / f"simulator-{self._starts}.log", "ab")  # noqa: SIM115
            # Webhooks deterministic by default: no duplicates, no delay (the
            # control port turns them on: faults(webhook_duplicate_rate=...)).
            webhooks = ["--webhook-duplicate-rate", "0", "--webhook-max-delay-ms", "0"]
            if self.webhook_url:
                webhooks += ["--webhook-url", self.webhook_url, "--webhook-timeout", "5"]
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "devtools.simulator", "--port", str(self.port)]
                + ["--db", str(self.db_path), "--hold-seconds", "30"]
                + webhooks,
                env={**os.environ, "SIMULATOR_WEBHOOK_SECRET": settings.PAYMENTS_WEBHOOK_SECRET},
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=log,
                # Ended with pytest, even a pytest killed outright.
                preexec_fn=die_with_parent(signal.SIGTERM),
            )
            log.close()
            ready, _, _ = select.select([self.proc.stdout], [], [], 15)
            line = self.proc.stdout.readline() if ready else b""
            if line:
                info = json.loads(line)
                self.port, self.control_port = info["port"], info["control_port"]
                return self
            # The old port may still be held for a moment after a kill: try again.
            self.proc.kill()
            self.proc.wait()
            time.sleep(0.2)
        raise RuntimeError("the simulator did not start")

    def kill(self) -> None:
        """SIGKILL: no cleanup, exactly like a crash."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()

    # -- control ----------------------------------------------------------------

    def faults(self, **faults) -> dict:
        response = requests.post(f"{self.control_url}/faults", json=faults, timeout=10)
        response.raise_for_status()
        return response.json()

    def release(self) -> dict:
        return requests.post(f"{self.control_url}/release", json={}, timeout=10).json()

    def state(self) -> dict:
        return requests.get(f"{self.control_url}/state", timeout=10).json()

    def wait_for(self, predicate, *, timeout: float = 15.0) -> dict:
        """Poll the control state until `predicate(state)` holds."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.state()
            if predicate(state):
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"simulator never reached the state; last: {state}")
            time.sleep(0.05)

    def webhook_events(self, key: str | None = None) -> list[dict]:
        """The ledger's webhook events (all, or of one operation key) with their delivery state."""
        params = {"key": key} if key else {}
        response = requests.get(f"{self.control_url}/webhooks", params=params, timeout=10)
        response.raise_for_status()
        return response.json()["results"]

    def ledger(self, key_prefix: str = "") -> list[dict]:
        response = requests.get(
            f"{self.url}/v1/ledger", params={"key_prefix": key_prefix, "limit": 1000}, timeout=10
        )
        response.raise_for_status()
        return response.json()["results"]

    def charges(self, key: str) -> list[dict]:
        """Succeeded captures stored under one key (the money movements)."""
        return [
            op
            for op in self.ledger(key)
            if op["key"] == key and op["kind"] == "capture" and op["status"] == "succeeded"
        ]


def settle_due(payment) -> object:
    """Make the payment's settlement due now and run one attempt in this process."""
    from payments.models import PaymentSettlement
    from payments.settlement import payment_settle

    settlement = PaymentSettlement.objects.get(transaction__payment=payment)
    PaymentSettlement.objects.filter(id=settlement.id).update(next_attempt_at=Now())
    return payment_settle(settlement_id=settlement.id)


def reconcile() -> dict:
    """Run `manage.py reconcile_payments --json` in this process; return its report."""
    out = StringIO()
    try:
        call_command("reconcile_payments", "--json", stdout=out)
    except CommandError as exc:
        report = json.loads(out.getvalue())
        report["error"] = str(exc)
        return report
    return json.loads(out.getvalue())


def assert_reconciled() -> dict:
    report = reconcile()
    assert report["clean"], report
    return report
