"""Celery on RabbitMQ (`CELERY_BROKER_URL=amqp://...`, docs/celery.md "RabbitMQ"), for real.

The settings a fresh interpreter derives from an amqp URL; `/healthz` on it;
publisher confirms; a real worker on amqp; a relay killed between publish and
mark, its copies suppressed by the consumers. The worker killed mid-task is
tests/config/test_celery.py's redelivery test, parametrised by broker.
Marked `rabbitmq`: skipped when no RabbitMQ answers (tests/support/rabbitmq.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import amqp
import kombu
import pytest
from django.db.models.functions import Now

from idempotency import metrics
from idempotency.models import Delivery, OutboxMessage
from tests.backoffice.test_health import _closed_port, _healthz
from tests.config.test_settings import ROOT
from tests.idempotency.test_relay import POINTS, effects, relay_process, write_orders
from tests.support import rabbitmq
from tests.support.models import DueChore
from tests.support.servers import wait_until

AMQP = rabbitmq.RABBITMQ_URL


@pytest.fixture
def amqp_broker():
    """RabbitMQ answering, the shop's queues emptied before and after."""
    rabbitmq.require()
    rabbitmq.purge()
    yield
    rabbitmq.purge()


PRINT_CELERY = """
import json, django
from django.conf import settings
django.setup()
from config.celery import app
from core import due
c = app.conf
print(json.dumps({
    'transport': c.broker_transport, 'options': c.broker_transport_options,
    'heartbeat': c.broker_heartbeat, 'acks_late': c.task_acks_late,
    'reject_on_worker_lost': c.task_reject_on_worker_lost,
    'prefetch': c.worker_prefetch_multiplier,
    'cancel_on_loss': c.worker_cancel_long_running_tasks_on_connection_loss,
    'time_limit': c.task_time_limit, 'max_countdown': due.max_countdown(),
}))
"""


def _run_settings(url: str, *, code: str = PRINT_CELERY) -> subprocess.CompletedProcess:
    """Run `code` (default: print the Celery settings) with broker `url` in a fresh interpreter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "SHOP_"))}
    env.update(
        SHOP_ENV_FILE=os.devnull, DJANGO_SETTINGS_MODULE="config.settings.base",
        CELERY_BROKER_URL=url,
    )  # fmt: skip
    return subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
    )


def _celery_conf(url: str) -> dict:
    out = _run_settings(url)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("scheme", ["amqp", "amqps", "pyamqp"])
def test_an_amqp_url_gets_confirms_heartbeats_and_no_visibility_timeout(scheme):
    conf = _celery_conf(f"{scheme}://guest:guest@rabbit.internal:5672/shop")
    assert conf["options"] == {"confirm_publish": True}  # no visibility_timeout, no restore
    assert conf["transport"] is None  # kombu's own amqp transport, not our Redis fix
    assert 0 < conf["heartbeat"] <= 60
    assert conf["acks_late"] and conf["reject_on_worker_lost"] and conf["prefetch"] == 1
    assert conf["cancel_on_loss"] is True
    # The same window as on Redis: the same countdown cap and time limits.
    redis_conf = _celery_conf("redis://127.0.0.1:6379/0")
    assert redis_conf["transport"] == "core.patches.redis_transport:Transport"
    assert "visibility_timeout" in redis_conf["options"]
    assert (conf["time_limit"], conf["max_countdown"]) == (
        redis_conf["time_limit"],
        redis_conf["max_countdown"],
    )


def test_a_broker_url_of_another_kind_is_refused():
    out = _run_settings("sqs://queue")
    assert out.returncode != 0
    assert "CELERY_BROKER_URL must be redis://" in out.stderr


@pytest.mark.rabbitmq
def test_healthz_checks_rabbitmq_and_the_cache_when_it_is_the_broker():
    rabbitmq.require()
    up = _healthz(CELERY_BROKER_URL=AMQP)
    assert up["status"] == 200, up
    assert up["body"]["checks"] == {"database": "ok", "broker": "ok", "cache": "ok"}

    down = _healthz(CELERY_BROKER_URL=f"amqp://guest:guest@127.0.0.1:{_closed_port()}//")
    assert down["status"] == 503
    assert down["type"].startswith("application/problem+json")
    assert down["body"]["errors"]["broker"] != "ok"
    assert down["body"]["errors"]["database"] == "ok"
    assert down["body"]["errors"]["cache"] == "ok"


COUNT_QUEUE = """
import django
django.setup()
from core import due
name = 'orders.compensation_step'
print(due.queued(name), due.sweep_room(name, limit=5), due.queued('reports.extract'))
"""


@pytest.mark.rabbitmq
def test_a_sweep_counts_the_messages_waiting_in_its_queue_on_rabbitmq(amqp_broker):
    # core.due.sweep_room: a passive declare's ready count (Redis: the list's length).
    for step in range(3):
        rabbitmq.send_task("orders.compensation_step", [step])
    out = _run_settings(AMQP, code=COUNT_QUEUE)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == ["3", "2", "0"]  # waiting, room left of 5, none waiting


@pytest.mark.rabbitmq
def test_a_publish_waits_for_its_confirm_and_a_refused_one_raises(amqp_broker):
    """With confirms the broker's refusal reaches the publisher; without, it vanishes."""
    with rabbitmq.connection() as conn:
        producer = kombu.Producer(conn.default_channel)
        producer.publish({"n": 1}, routing_key="celery", declare=[kombu.Queue("celery")])
        assert conn.default_channel._confirm_selected  # the channel is in confirm mode
        with pytest.raises(amqp.exceptions.NotFound):
            producer.publish({"n": 2}, exchange="no-such-exchange", routing_key="x")
    assert rabbitmq.queue_depth("celery") == 1
    rabbitmq.purge("celery")
    with kombu.Connection(AMQP, heartbeat=0) as unconfirmed:
        # The same refusal without confirms: publish returns as if all was well.
        kombu.Producer(unconfirmed.default_channel).publish(
            {"n": 3}, exchange="no-such-exchange", routing_key="x"
        )


@pytest.mark.rabbitmq
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_on_rabbitmq_runs_a_due_task(amqp_broker, celery_worker_process):
    chore = DueChore.objects.create(label="on amqp")
    worker = celery_worker_process(CELERY_BROKER_URL=AMQP)
    assert "amqp://" in worker.log()
    rabbitmq.send_task("testsupport.work_chore", [chore.pk])
    wait_until(
        lambda: DueChore.objects.filter(pk=chore.pk, done_at__isnull=False).exists(),
        timeout=60,
        message=worker.log(),
    )
    assert DueChore.objects.get(pk=chore.pk).attempts == 1


@pytest.mark.rabbitmq
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_relay_on_rabbitmq_killed_between_publish_and_mark_costs_only_suppressed_copies(
    amqp_broker, shopper, tmp_path, celery_worker_process
):
    """The outbox flow end to end on amqp: relay publishes (confirmed), dies before it
    marks; the next relay publishes again; the worker applies each effect once."""
    n = 10
    write_orders(shopper, n)
    crashed = relay_process(
        tmp_path, "--once", CELERY_BROKER_URL=AMQP, SHOP_FAILPOINTS="relay.published=exit@1"
    )
    assert crashed.wait(60) == 1
    # Confirmed: every publish is in the queue; one ring per consumer for the batch of n
    # (docs/events.md, "Batched consumers").
    assert rabbitmq.queue_depth() == 2
    OutboxMessage.objects.update(lease_expires_at=Now())
    again = relay_process(tmp_path, "--once", CELERY_BROKER_URL=AMQP)
    assert again.wait(60) == 0
    assert rabbitmq.queue_depth() == 4

    # One process, as in tests/idempotency/test_relay.py: each consumer's second ring
    # meets its rows done and counts every copy (two processes may run both rings at
    # once; the later claim skips the held rows and counts nothing).
    celery_worker_process(concurrency=1, CELERY_BROKER_URL=AMQP)
    wait_until(
        lambda: (
            rabbitmq.queue_depth() == 0
            and not Delivery.objects.filter(done_at__isnull=True).exists()
        ),
        timeout=120,
        message="the worker drains both copies",
    )

    def copies_counted() -> bool:
        counts = metrics.duplicate_totals()
        return counts[metrics.INBOX_DUPLICATE] == n and counts[metrics.PROCESSED_ID] == n

    wait_until(copies_counted, timeout=60, message=f"{metrics.duplicate_totals()}")
    assert effects(shopper) == (n * POINTS, n * 2)
