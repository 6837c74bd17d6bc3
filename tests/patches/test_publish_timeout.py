"""A publish to a RabbitMQ under a memory alarm returns within BROKER_PUBLISH_TIMEOUT;
on a hung Redis, cache reads and publishes raise instead of blocking.

Under a memory alarm RabbitMQ stops reading from publishing connections
without closing them: the message is written, its confirm never comes.
Before the fix (core/patches/celery_publish.py's BoundedPublishAMQP) the publish waited for
the confirm with no timeout, so the request that rang for a due row hung for
as long as the alarm lasted. The local RabbitMQ is shared: the alarm lasts a
few seconds and the watermark is ALWAYS restored.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Callable

import pytest
from django.conf import settings

from tests.support import rabbitmq

NORMAL_WATERMARK = "0.4"


def _watermark(value: str) -> None:
    subprocess.run(
        ["rabbitmqctl", "-q", "set_vm_memory_high_watermark", value],
        check=True,
        capture_output=True,
        timeout=30,
    )


@pytest.mark.rabbitmq
def _warm(app, conn) -> None:
    """Publish once before the alarm; skip when the shared broker is already alarmed."""
    try:
        app.send_task("testsupport.nothing", args=[0], connection=conn, retry=False)
    except Exception as exc:  # noqa: BLE001 - an alarm raised by someone else, or memory
        pytest.skip(f"RabbitMQ does not confirm even before our alarm: {exc}")


def _under_alarm(publish: Callable[[], None], *, wait: float) -> bool:
    """Run `publish` in a thread while the broker is under a memory alarm; True if it
    finished within `wait` seconds. In a thread, so that the watermark is restored even
    if the publish blocks (a blocked main thread never reaches `finally` before a kill)."""
    try:
        _watermark("0.0001")
        time.sleep(1.0)  # the alarm is raised at the monitor's next look (well under 1 s)
        thread = threading.Thread(target=publish, daemon=True)
        thread.start()
        thread.join(wait)
        finished = not thread.is_alive()
    finally:
        _watermark(NORMAL_WATERMARK)
    thread.join(30)
    return finished


@pytest.mark.rabbitmq
def test_a_publish_under_a_memory_alarm_raises_within_the_confirm_timeout():
    from config.celery import app

    rabbitmq.require()
    rabbitmq.purge()
    outcome: dict[str, object] = {}
    with rabbitmq.connection() as conn:
        # Warm: the connection is open and confirms work before the alarm.
        _warm(app, conn)

        def publish() -> None:
            try:
                app.send_task("testsupport.nothing", args=[1], connection=conn, retry=False)
                outcome["result"] = "published"
            except Exception as exc:  # noqa: BLE001 - the outcome is what we assert on
                outcome["result"] = type(exc).__name__

        # Generous: the bound is BROKER_PUBLISH_TIMEOUT; an unbounded wait never returns
        # while the alarm lasts.
        finished_under_alarm = _under_alarm(
            publish, wait=getattr(settings, "BROKER_PUBLISH_TIMEOUT", 3.0) + 10
        )
    rabbitmq.purge()
    assert finished_under_alarm, "the publish blocked for as long as the alarm lasted"
    assert outcome["result"] != "published"


@pytest.mark.rabbitmq
def test_in_a_web_request_a_publish_waits_no_longer_than_what_is_left_of_its_deadline(settings):
    """The confirm timeout is cut to the request's deadline (core.deadline.bounded)."""
    from config.celery import app
    from core.deadline import set_deadline

    settings.BROKER_PUBLISH_TIMEOUT = 4.0
    rabbitmq.require()
    rabbitmq.purge()
    took: dict[str, float] = {}
    with rabbitmq.connection() as conn:
        _warm(app, conn)

        def publish() -> None:
            set_deadline(0.5)
            started = time.monotonic()
            try:
                app.send_task("testsupport.nothing", args=[1], connection=conn, retry=False)
            except Exception:  # noqa: BLE001, S110 - only the time it took matters here
                pass
            took["seconds"] = time.monotonic() - started

        _under_alarm(publish, wait=settings.BROKER_PUBLISH_TIMEOUT + 10)
    rabbitmq.purge()
    # The whole confirm timeout (the wrong twin: the bound not cut) would be 4 s.
    assert took["seconds"] < 2.0


@pytest.mark.rabbitmq
def test_after_a_timed_out_confirm_the_next_publish_goes_through():
    """The timed-out connection is thrown away: the next publish (the sweeper's ring) works."""
    from config.celery import app

    rabbitmq.require()
    rabbitmq.purge()
    with rabbitmq.connection() as conn:
        _warm(app, conn)
        failed: list[str] = []

        def publish() -> None:
            try:
                app.send_task("testsupport.nothing", args=[1], connection=conn, retry=False)
            except Exception as exc:  # noqa: BLE001
                failed.append(type(exc).__name__)

        _under_alarm(publish, wait=getattr(settings, "BROKER_PUBLISH_TIMEOUT", 3.0) + 10)
    assert failed, "the publish under the alarm did not raise in time"
    time.sleep(1.0)
    before = rabbitmq.queue_depth()
    with rabbitmq.connection() as conn:
        app.send_task("testsupport.nothing", args=[2], connection=conn, retry=False)
    assert rabbitmq.queue_depth() >= before + 1
    rabbitmq.purge()


def _declares_over_a_partition(settings) -> dict[str, object]:
    """Publish to a queue this connection has not published to yet (kombu declares it
    first) while the link to RabbitMQ is partitioned; say whether it finished within the
    publish's bound + 5 s and what it gave. The partition heals afterwards either way."""
    import uuid
    from urllib.parse import urlsplit

    from config.celery import app
    from tools.chaos.faultproxy import FaultProxy, via

    settings.BROKER_PUBLISH_TIMEOUT = 1.0
    rabbitmq.require()
    broker = urlsplit(rabbitmq.RABBITMQ_URL)
    proxy = FaultProxy(target=(broker.hostname or "127.0.0.1", broker.port or 5672)).start()
    queue = f"test-declare-{uuid.uuid4().hex[:8]}"
    outcome: dict[str, object] = {}
    try:
        with rabbitmq.connection(via(rabbitmq.RABBITMQ_URL, proxy.port)) as conn:
            _warm(app, conn)  # connected, and its first queue declared
            proxy.drop()

            def publish() -> None:
                try:
                    app.send_task(
                        "testsupport.nothing", args=[1], connection=conn, queue=queue, retry=False
                    )
                    outcome["result"] = "published"
                except Exception as exc:  # noqa: BLE001 - the outcome is what we assert on
                    outcome["result"] = type(exc).__name__

            thread = threading.Thread(target=publish, daemon=True)
            thread.start()
            thread.join(settings.BROKER_PUBLISH_TIMEOUT + 5)
            outcome["finished"] = not thread.is_alive()
            proxy.heal()
            thread.join(30)
    finally:
        proxy.stop()
        with rabbitmq.connection() as conn:
            conn.default_channel.queue_delete(queue)
    return outcome


@pytest.mark.rabbitmq
def test_a_publish_that_declares_its_queue_on_a_partitioned_link_raises_within_its_bound(
    settings,
):
    """A web request's ring in a RabbitMQ chaos run waited 25.8 s, until a broker partition
    healed, in kombu's declare of its queue (docs/failure-model.md, "What broke")."""
    outcome = _declares_over_a_partition(settings)
    assert outcome["finished"], "the declare waited for the heal"
    assert outcome["result"] != "published"


@pytest.mark.rabbitmq
def test_wrong_twin_without_the_socket_bound_the_declare_waits_for_the_heal(settings, monkeypatch):
    from core.patches import celery_publish

    monkeypatch.setattr(
        celery_publish, "_amqp_socket_bounded", lambda producer, seconds: contextlib.nullcontext()
    )
    outcome = _declares_over_a_partition(settings)
    assert not outcome["finished"]
    assert outcome["result"] == "published"  # once healed


HUNG_REDIS_CALLS = """
import django, json
django.setup()
from django.core.cache import cache
from config.celery import app
out = {}
try:
    cache.get('throttle-probe')
    out['cache'] = 'answered'
except Exception as exc:
    out['cache'] = type(exc).__name__
try:
    app.send_task('chaos.none', args=[1], retry=False)
    out['publish'] = 'published'
except Exception as exc:
    out['publish'] = type(exc).__name__
print(json.dumps(out))
"""


@pytest.mark.parametrize("_", [None], ids=["redis"])
def test_a_hung_redis_fails_cache_reads_and_publishes_instead_of_blocking(_):
    """Throttles (the cache) and a publish on a SIGSTOPped Redis raise, bounded.

    Before the fix both waited on the socket forever (the subprocess timed out).
    """
    import json
    import os
    import signal
    import sys

    from tests.config.test_broker_outage import free_port, redis_server
    from tests.config.test_settings import ROOT

    port = free_port()
    with redis_server(port) as proc:
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            env = dict(
                os.environ,
                DJANGO_SETTINGS_MODULE="config.settings.base",
                REDIS_URL=f"redis://127.0.0.1:{port}/0",
            )
            out = subprocess.run(
                [sys.executable, "-c", HUNG_REDIS_CALLS], env=env, cwd=ROOT,
                capture_output=True, text=True, timeout=90,
            )  # fmt: skip
        finally:
            os.kill(proc.pid, signal.SIGCONT)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["cache"] != "answered"
    assert result["publish"] != "published"
