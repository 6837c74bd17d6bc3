"""A publish to a RabbitMQ under a memory alarm returns within BROKER_PUBLISH_TIMEOUT.

Under a memory alarm RabbitMQ stops reading from publishing connections
without closing them: the message is written, its confirm never comes.
Before the fix (config/celery.py's BoundedPublishAMQP) the publish waited for
the confirm with no timeout, so the request that rang for a due row hung for
as long as the alarm lasted. The local RabbitMQ is shared: the alarm lasts a
few seconds and the watermark is ALWAYS restored.
"""

from __future__ import annotations

import subprocess
import threading
import time

import pytest
from django.conf import settings

from tests.support import rabbitmq

pytestmark = pytest.mark.rabbitmq

NORMAL_WATERMARK = "0.4"


def _watermark(value: str) -> None:
    subprocess.run(
        ["rabbitmqctl", "-q", "set_vm_memory_high_watermark", value],
        check=True,
        capture_output=True,
        timeout=30,
    )


def test_a_publish_under_a_memory_alarm_raises_within_the_confirm_timeout():
    from config.celery import app

    rabbitmq.require()
    rabbitmq.purge()
    outcome: dict[str, object] = {}
    with rabbitmq.connection() as conn:
        # Warm: the connection is open and confirms work before the alarm.
        app.send_task("testsupport.nothing", args=[0], connection=conn, retry=False)

        def publish() -> None:
            try:
                app.send_task("testsupport.nothing", args=[1], connection=conn, retry=False)
                outcome["result"] = "published"
            except Exception as exc:  # noqa: BLE001 - the outcome is what we assert on
                outcome["result"] = type(exc).__name__

        try:
            _watermark("0.0001")
            time.sleep(1.0)  # the alarm is raised at the monitor's next look (well under 1 s)
            thread = threading.Thread(target=publish, daemon=True)
            thread.start()
            # Generous: the bound is BROKER_PUBLISH_TIMEOUT; an unbounded wait never returns
            # while the alarm lasts.
            thread.join(getattr(settings, "BROKER_PUBLISH_TIMEOUT", 3.0) + 10)
            finished_under_alarm = not thread.is_alive()
        finally:
            _watermark(NORMAL_WATERMARK)
        thread.join(30)
    rabbitmq.purge()
    assert finished_under_alarm, "the publish blocked for as long as the alarm lasted"
    assert outcome["result"] != "published"


def test_after_a_timed_out_confirm_the_next_publish_goes_through():
    """The timed-out connection is thrown away: the next publish (the sweeper's ring) works."""
    from config.celery import app

    rabbitmq.require()
    rabbitmq.purge()
    with rabbitmq.connection() as conn:
        app.send_task("testsupport.nothing", args=[0], connection=conn, retry=False)
        try:
            _watermark("0.0001")
            time.sleep(1.0)
            with pytest.raises(Exception):  # noqa: B017 - a timeout, whatever its class
                app.send_task("testsupport.nothing", args=[1], connection=conn, retry=False)
        finally:
            _watermark(NORMAL_WATERMARK)
    time.sleep(1.0)
    before = rabbitmq.queue_depth()
    with rabbitmq.connection() as conn:
        app.send_task("testsupport.nothing", args=[2], connection=conn, retry=False)
    assert rabbitmq.queue_depth() >= before + 1
    rabbitmq.purge()
