"""The simulator's threads: kept from one connection to the next, never waited for.

In process (`devtools.simulator.server.Simulator`), so its threads and the
ledger's SQLite connections can be counted.
"""

import sqlite3
import threading
from http.server import ThreadingHTTPServer

import pytest
import requests

from devtools.simulator import ledger as ledger_module
from devtools.simulator import server as server_module
from devtools.simulator.server import Simulator
from tests.support.servers import wait_until


def started(tmp_path):
    simulator = Simulator(db_path=str(tmp_path / "ledger.sqlite3"))
    simulator.start(port=0)
    return simulator


@pytest.fixture
def sim(tmp_path):
    simulator = started(tmp_path)
    yield simulator
    simulator.stop()


@pytest.fixture
def connects(monkeypatch):
    """Count the ledger's SQLite connections opened from now on."""
    opened = []
    real = sqlite3.connect

    def counting(*args, **kwargs):
        opened.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(ledger_module.sqlite3, "connect", counting)
    return opened


def charge(sim, key):
    return requests.post(
        f"http://127.0.0.1:{sim.api_port}/v1/captures",
        json={
            "amount": "10.00",
            "currency": "EUR",
            "payment_method": "pm_card_ok",
            "reference": key,
        },
        headers={"Idempotency-Key": key},
        timeout=5,
    )


def test_sequential_calls_reuse_threads_and_their_ledger_connections(sim, connects):
    for n in range(20):
        assert charge(sim, f"seq-{n}").status_code == 201
    # One connection per call (HTTP/1.0): a kept thread opens the ledger once. A
    # call may arrive before the last one's thread is back among the idle ones,
    # so a few threads, never one per call.
    assert len(connects) <= 3, connects


def test_wrong_twin_a_thread_per_connection_opens_the_ledger_per_call(
    tmp_path, connects, monkeypatch
):
    monkeypatch.setattr(server_module, "PooledHTTPServer", ThreadingHTTPServer)
    sim = started(tmp_path)
    try:
        for n in range(20):
            assert charge(sim, f"seq-{n}").status_code == 201
    finally:
        sim.stop()
    assert len(connects) >= 20


def test_paused_calls_each_get_a_thread(sim):
    """A call held by a fault never makes the next one wait for a thread."""
    sim.set_faults({"pause": "before_apply"})
    answers = []
    callers = [
        threading.Thread(target=lambda n=n: answers.append(charge(sim, f"held-{n}")))
        for n in range(5)
    ]
    for caller in callers:
        caller.start()
    wait_until(lambda: sim.state()["paused"] == 5, timeout=5, message="5 calls paused")
    sim.release()
    for caller in callers:
        caller.join(10)
    assert sorted(a.status_code for a in answers) == [201] * 5
