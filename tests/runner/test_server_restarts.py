"""An embedded server that dies under the run command is restarted; the shop recovers."""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from types import SimpleNamespace

import pytest
import requests

from runner import supervisor
from runner.processes import free_port
from tests.runner.conftest import embedded_env, leftovers, start_run, wait_for, wait_up

RECOVERY = 30  # seconds from the kill to /healthz 200 again


class FakeServer:
    name = "Fake"

    def __init__(self, *, fails: int) -> None:
        self.up = False
        self.fails = fails
        self.restarts = 0

    def running(self) -> bool:
        return self.up

    def restart(self) -> str:
        self.restarts += 1
        if self.restarts <= self.fails:
            raise RuntimeError("will not start")
        self.up = True
        return "fake://"


def _poll_until(restarts, clock, *, seconds: float) -> bool:
    for _ in range(int(seconds * 10)):
        clock[0] += 0.1
        if not restarts.poll():
            return False
    return True


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(supervisor.time, "monotonic", lambda: now[0])
    return now


def test_a_dead_server_is_restarted_after_a_growing_backoff(clock):
    server = FakeServer(fails=2)
    restarts = supervisor.ServerRestarts(SimpleNamespace(started=[server]))
    assert restarts.poll()  # noticed: restart due in 1 s
    assert server.restarts == 0
    assert _poll_until(restarts, clock, seconds=1.05) and server.restarts == 1  # failed
    assert _poll_until(restarts, clock, seconds=1.9) and server.restarts == 1  # waits 2 s
    assert _poll_until(restarts, clock, seconds=0.2) and server.restarts == 2  # failed
    assert _poll_until(restarts, clock, seconds=4.2) and server.restarts == 3
    assert server.up


def test_a_server_that_keeps_failing_ends_the_run(clock):
    server = FakeServer(fails=100)
    restarts = supervisor.ServerRestarts(SimpleNamespace(started=[server]))
    assert not _poll_until(restarts, clock, seconds=1 + 2 + 4 + 8 + 16 + 2)
    assert server.restarts == supervisor.SERVER_RESTARTS


def test_a_minute_up_forgets_earlier_deaths(clock):
    server = FakeServer(fails=0)
    restarts = supervisor.ServerRestarts(SimpleNamespace(started=[server]))
    for _ in range(supervisor.SERVER_RESTARTS + 2):
        server.up = False
        assert _poll_until(restarts, clock, seconds=62 + 31)  # restarted, then a minute up
    assert server.restarts == supervisor.SERVER_RESTARTS + 2


ORDER = {
    "lines": [{"sku": "TEE-M", "quantity": 1}],
    "on_shortage": "reject",
    "payment_method": "pm_card_ok",
    "shipping_address": {
        "name": "Ada",
        "line1": "1 Loop Road",
        "city": "Berlin",
        "postal_code": "10115",
        "country": "DE",
    },
}


def _checkout(base: str, token: str) -> requests.Response:
    return requests.post(
        f"{base}/api/v1/orders/",
        json=ORDER,
        headers={"Authorization": f"Token {token}", "Idempotency-Key": uuid.uuid4().hex},
        timeout=30,
    )


def _kill_and_recover(base: str, log_path, pid: int, name: str) -> list[int]:
    """SIGKILL a server; return the /healthz answers until it is restarted and 200 again."""
    supervisor_said = f"run: restarted embedded {name}"
    before = log_path.read_text().count(supervisor_said)
    killed_at = time.monotonic()
    statuses: list[int] = []

    def recovered() -> bool:
        try:
            statuses.append(requests.get(f"{base}/healthz", timeout=15).status_code)
        except requests.RequestException:
            statuses.append(0)
        return log_path.read_text().count(supervisor_said) > before and statuses[-1] == 200

    os.kill(pid, signal.SIGKILL)
    wait_for(recovered, timeout=RECOVERY, message=f"no /healthz 200 after killing {name}")
    assert time.monotonic() - killed_at < RECOVERY
    return statuses


@pytest.mark.embedded
@pytest.mark.slow
def test_run_restarts_killed_postgres_and_redis_and_the_shop_recovers(short_tmp, marker):
    var = short_tmp / "var"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = embedded_env(marker=marker, var=var, PORT=str(port), WEB_CONCURRENCY="1")
    log_path = short_tmp / "run.log"
    with open(log_path, "wb") as log:
        run = start_run(env, log)
    try:
        wait_up(base, run, log_path)
        token = requests.post(
            f"{base}/api/v1/auth/token/",
            json={"username": "shopper", "password": "shopper-demo"},
            timeout=10,
        ).json()["token"]
        redis_port = (var / "redis" / "redis.conf").read_text().split("\nport ")[1].split()[0]

        # PostgreSQL: the postmaster, killed outright.
        postmaster = int((var / "postgres" / "postmaster.pid").read_text().split()[0])
        _kill_and_recover(base, log_path, postmaster, "PostgreSQL")
        answer = _checkout(base, token)
        assert answer.status_code == 201, answer.text
        assert answer.json()["status"] == "confirmed"

        # Redis: the broker and cache; /healthz checks it with a fresh client,
        # so the outage shows.
        redis_pid = int((var / "redis" / "redis.pid").read_text())
        statuses = _kill_and_recover(base, log_path, redis_pid, "Redis")
        assert 503 in statuses, statuses
        assert f"\nport {redis_port}\n" in (var / "redis" / "redis.conf").read_text()
        answer = _checkout(base, token)
        assert answer.status_code == 201, answer.text
        # Beat and the worker reconnected: a periodic task goes through the
        # broker again and runs on the database (beat sends it every 5 s).
        since = len(log_path.read_text())
        wait_for(
            lambda: re.search(r"sweep_settlements\[\S+\] succeeded", log_path.read_text()[since:]),
            timeout=RECOVERY,
            message="no periodic task ran after the restarts",
        )

        assert run.poll() is None, log_path.read_text()[-3000:]
        run.send_signal(signal.SIGINT)
        assert run.wait(timeout=90) == 0, log_path.read_text()[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert leftovers(marker=marker, under=var) == []
