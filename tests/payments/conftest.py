"""Fixtures for payment tests: a real simulator process and real shop subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import database_url_for_current_connection
from tests.support.simulator import Simulator, assert_reconciled, reconcile, settle_due  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def simulator(tmp_path):
    sim = Simulator(tmp_path).start()
    yield sim
    sim.stop()


@pytest.fixture
def provider(simulator, settings):
    """Point the shop's gateway at a fresh simulator; short timeout so lost answers are quick."""
    settings.PAYMENTS_PROVIDER_URL = simulator.url
    settings.PAYMENTS_PROVIDER_TIMEOUT = 1.0
    return simulator


@pytest.fixture
def settled_calls(settings):
    """Record every call of the settled-outcome handler."""
    from tests.payments import handlers

    handlers.calls.clear()
    settings.PAYMENTS_SETTLED_HANDLER = "tests.payments.handlers.record"
    yield handlers.calls
    handlers.calls.clear()


def subprocess_database_url() -> str:
    """The URL of the test database this process uses (for shop subprocesses)."""
    return database_url_for_current_connection()


def shop_env(simulator: Simulator, **extra: str) -> dict[str, str]:
    """Environment for a shop subprocess: same test database, same simulator."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOP_FAILPOINTS")}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.test",
        DATABASE_URL=subprocess_database_url(),
        DB_POOL="false",
        PAYMENTS_PROVIDER_URL=simulator.url,
        PAYMENTS_PROVIDER_TIMEOUT="5",
    )
    env.update(extra)
    return env


CAPTURE_SCRIPT = """
import json, sys
import django
django.setup()
from django.db import connection
from payments.capture import payment_capture
connection.ensure_connection()
if sys.argv[2] == "wait":
    print("ready", flush=True)
    sys.stdin.readline()  # the barrier: the test releases every process at once
result = payment_capture(payment_id=sys.argv[1])
print(json.dumps({"outcome": result.outcome, "status": result.payment.status}), flush=True)
"""


SETTLE_SCRIPT = """
import json, sys
import django
django.setup()
from payments.settlement import payment_settle
settlement = payment_settle(settlement_id=int(sys.argv[1]))
print(json.dumps({"attempts": settlement.attempts}), flush=True)
"""


def run_settle_process(simulator: Simulator, settlement_id: int, **env: str):
    """Run one settlement attempt in a separate shop process (a worker) and wait for it."""
    return subprocess.run(
        [sys.executable, "-c", SETTLE_SCRIPT, str(settlement_id)],
        cwd=ROOT,
        env=shop_env(simulator, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def start_capture_process(
    simulator: Simulator, payment_id, *, wait: bool = False, **env: str
) -> subprocess.Popen:
    """Start a shop process that captures one payment (after a `go` line if `wait`)."""
    return subprocess.Popen(
        [sys.executable, "-c", CAPTURE_SCRIPT, str(payment_id), "wait" if wait else "now"],
        cwd=ROOT,
        env=shop_env(simulator, **env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
