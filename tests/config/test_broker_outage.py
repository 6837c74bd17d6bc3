"""A Celery worker outlives a Redis outage by itself (docs/celery.md, "A lost broker").

Its own redis-server on a free port, a real worker with its broker there
holding an unacknowledged message (a countdown: acks_late keeps it unacked
while it waits, as a running task's message is), Redis killed for 30 s and
started again empty: the same worker process, never restarted by hand,
consumes a new task within a bound. Before core/patches/redis_transport.py the
worker died at the loss (AttributeError in kombu's reconnect path) and nothing
ran until something restarted it.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time

import pytest
import redis
from django.conf import settings

from config.celery import app
from tests.support.models import DueChore
from tests.support.servers import wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]

OUTAGE = 30.0  # seconds Redis stays away
# The worker retries every 2, 4, 6, ... seconds, at most 30 s apart (kombu's
# ensure_connection), forever (broker_connection_max_retries=None): once Redis
# is back it reconnects within one retry interval, and then runs the task.
RECOVERY_BOUND = 30.0 + 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def redis_server(port: int):
    """A private, empty redis-server on `port` until the block ends (killed: no save)."""
    proc = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--port", str(port), "--save", "",
         "--appendonly", "no", "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(port=port)

    def up() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    try:
        wait_until(up, timeout=10, message="own redis-server up")
        yield proc
    finally:
        proc.kill()
        proc.wait(5)


def send(broker_url: str, chore: DueChore, **options) -> None:
    with app.connection_for_write(broker_url) as conn:
        app.send_task("testsupport.work_chore", args=[chore.pk], connection=conn, **options)


def done(chore: DueChore) -> bool:
    return DueChore.objects.filter(pk=chore.pk, done_at__isnull=False).exists()


def test_the_transport_is_the_fixed_one():
    assert settings.CELERY_BROKER_TRANSPORT == "core.patches.redis_transport:Transport"
    assert app.conf.broker_connection_retry is True
    assert app.conf.broker_connection_max_retries is None  # never gives up on its broker
    with app.connection_for_read() as conn:
        assert conn.transport.driver_type == "redis"
        assert conn.transport.Channel.QoS.__module__ == "core.patches.redis_transport"


def test_a_worker_consumes_again_after_redis_was_gone_for_30_seconds(celery_worker_process):
    port = free_port()
    broker_url = f"redis://127.0.0.1:{port}/0"
    with redis_server(port) as first:
        worker = celery_worker_process(concurrency=2, CELERY_BROKER_URL=broker_url)
        before = DueChore.objects.create(label="before")
        send(broker_url, before)
        wait_until(lambda: done(before), timeout=30, message="the worker consumes")
        # An unacked message in the worker when the broker goes.
        held = DueChore.objects.create(label="held")
        send(broker_url, held, countdown=settings.CELERY_MAX_COUNTDOWN)
        wait_until(
            lambda: worker.log_path.read_text().count("] received") >= 2,
            timeout=30,
            message="the countdown message is held by the worker",
        )
        first.kill()  # the broker dies with whatever it held
        first.wait(5)
        time.sleep(OUTAGE)
        assert worker.process.poll() is None, "the worker exited during the outage"
    with redis_server(port):  # back, empty
        back = time.monotonic()
        after = DueChore.objects.create(label="after")
        send(broker_url, after)
        wait_until(
            lambda: done(after),
            timeout=RECOVERY_BOUND,
            interval=0.5,
            message=f"the worker consumes again within {RECOVERY_BOUND} s of Redis' return",
        )
        assert time.monotonic() - back < RECOVERY_BOUND
        assert worker.process.poll() is None  # the same process: nobody restarted it


def test_a_worker_that_exits_anyway_is_restarted_by_the_supervisor_with_backoff(tmp_path):
    """The fallback (`make run`): a worker that exits non-zero comes back, 1 s, 2 s, ... later."""
    import os
    import sys

    from runner.supervisor import Program, Supervisor

    crashing = Program("worker", ("{python}", "-c", "import sys; sys.exit(1)"))
    supervisor = Supervisor(
        programs=[crashing],
        ctx={"python": sys.executable},
        env=dict(os.environ),
        state_file=tmp_path / "state.json",
    )
    supervisor.start_all()
    child = supervisor.children[0]
    pids = [child.proc.pid]
    try:
        deadline = time.monotonic() + 20
        while len(pids) < 3 and time.monotonic() < deadline:
            supervisor.poll()
            if child.proc.pid != pids[-1]:
                pids.append(child.proc.pid)
            time.sleep(0.05)
        assert len(pids) == 3, "the worker was not restarted twice"
        assert child.backoff == 4.0  # 1 s, then 2 s, doubling up to runner.supervisor.MAX_BACKOFF
    finally:
        supervisor.stop_all()
