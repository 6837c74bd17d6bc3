"""Celery queues by kind of work (docs/celery.md, "Queues").

Every registered task is routed by name to a declared queue; the development
worker (make run, the chaos run, the tests' workers) consumes every queue; the
production files run one worker per queue (tests/config/test_process_files.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from config.celery import app
from runner.supervisor import PROGRAMS
from tests.support.servers import celery_worker, server_env

ROOT = Path(__file__).resolve().parents[2]


def our_tasks() -> list[str]:
    app.loader.import_default_modules()
    return sorted(name for name in app.tasks if not name.startswith("celery."))


def test_every_task_is_routed_by_name_to_a_declared_queue():
    declared = {queue.name for queue in app.conf.task_queues}
    assert declared == set(settings.SHOP_QUEUES)
    tasks = our_tasks()
    assert "payments.settle_payment" in tasks  # the apps' tasks are loaded
    for name in tasks:
        # An explicit route, not the default queue's catch-all.
        assert name in app.conf.task_routes, f"{name} has no route in CELERY_TASK_ROUTES"
        queue = app.amqp.router.route({}, name)["queue"]
        assert queue.name in declared, name
        # Its own exchange and routing key: Redis and RabbitMQ bind it the same way.
        assert queue.exchange.name == queue.routing_key == queue.name, name


def test_each_kind_of_work_has_its_queue():
    def queue_of(name: str) -> str:
        return app.amqp.router.route({}, name)["queue"].name

    assert {queue_of(n) for n in ("payments.settle_payment", "payments.refund")} == {"checkout"}
    consumers = ("shop.consume_loyalty", "shop.consume_history", "shop.consume_emails")
    assert {queue_of(n) for n in (*consumers, "idempotency.relay_outbox")} == {"events"}
    assert queue_of("orders.compensation_step") == "compensation"
    # Sending a shopper mail never queues before a delivery.
    assert queue_of("shop.send_mail") == "compensation"
    chain = ("make_days", "extract", "aggregate", "publish")
    assert {queue_of(f"reports.{n}") for n in chain} == {"reports"}
    sweeps = (
        "payments.sweep_settlements",
        "payments.sweep_refunds",
        "orders.sweep_compensation",
        "shop.sweep_mail",
    )
    assert {queue_of(n) for n in sweeps} == {"maintenance"}
    # No task is named twice (a second name would silently win in the routes).
    names = [task for tasks in settings.SHOP_QUEUES.values() for task in tasks]
    assert len(names) == len(set(names))
    # The catch-all is one of them, so a task without a route is still consumed.
    assert app.conf.task_default_queue in settings.SHOP_QUEUES


def test_the_development_worker_consumes_every_queue():
    """make run's workers (and the chaos run's hosts) start without -Q: Celery then
    consumes every queue of CELERY_TASK_QUEUES, and nothing else."""
    (worker,) = [program for program in PROGRAMS if program.name == "worker"]
    assert not {"-Q", "--queues", "-X", "--exclude-queues"} & set(worker.argv)
    assert set(app.amqp.queues) == set(settings.SHOP_QUEUES)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_started_without_queues_listens_on_every_queue(tmp_path):
    with celery_worker(env=server_env(), log_dir=tmp_path) as worker:
        found = re.search(r"([\w.-]+@[\w.-]+) ready\.", worker.log())
        assert found, worker.log()
        node = found.group(1)  # "test-1a2b3c4d@host ready."
        answer = subprocess.run(
            [sys.executable, "-m", "celery", "--app", "config.celery:app", "inspect",
             "active_queues", "--destination", node, "--timeout", "10", "--json"],
            cwd=ROOT, env=server_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert answer.returncode == 0, answer.stderr
        (consumed,) = json.loads(answer.stdout).values()
        assert {queue["name"] for queue in consumed} == set(settings.SHOP_QUEUES)
