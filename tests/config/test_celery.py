"""The Celery settings that make every task safe on Redis (docs/celery.md), proven.

On the Redis transport a message is unacked from its delivery (its countdown
included) until its task ends; past the visibility timeout Redis hands it to
a second worker. So: a retry countdown plus the longest a task may run stays
below the visibility timeout by construction; a worker process killed
mid-task gets its task back; beat's ticks expire instead of piling up.
"""

from __future__ import annotations

import random
import signal

import psutil
import pytest
import requests
from celery.schedules import crontab
from django.conf import settings
from django.db import connection

from config.celery import app
from core.api_tokens import api_token_issue
from idempotency.models import FINISHED, IdempotencyKey, OutboxMessage
from orders import tasks as order_tasks
from payments import tasks as payment_tasks
from tests.support import rabbitmq
from tests.support.models import ProbeRecord
from tests.support.servers import wait_until

OUR_TASKS = (
    "idempotency.complete_abandoned_keys",
    "idempotency.purge_finished_keys",
    "orders.expire_reservations",
    "payments.settle_payment",
    "payments.sweep_settlements",
)


def visibility_timeout() -> float:
    return float(app.conf.broker_transport_options["visibility_timeout"])


def registered_tasks() -> dict:
    app.loader.import_default_modules()
    return {name: app.tasks[name] for name in OUR_TASKS}


def test_the_app_redelivers_what_a_dead_worker_held_and_holds_at_most_one():
    conf = app.conf
    assert conf.worker_prefetch_multiplier == 1
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    # Every task is idempotent (re-reads rows, conditional updates): none opts out.
    for task in registered_tasks().values():
        assert task.acks_late is not False
        assert getattr(task, "reject_on_worker_lost", None) is not False


def test_no_task_runs_into_the_visibility_timeout():
    conf = app.conf
    assert conf.task_soft_time_limit and conf.task_time_limit
    assert conf.task_soft_time_limit < conf.task_time_limit
    # The longest countdown plus the longest run of the retried task stays unacked
    # for less than the visibility timeout.
    assert settings.CELERY_MAX_COUNTDOWN + conf.task_time_limit < visibility_timeout()
    for name, task in registered_tasks().items():
        limit = task.time_limit or conf.task_time_limit
        assert limit <= conf.task_time_limit, name
        assert task.max_retries is not None, name  # a poison message stops


def _delay_of(retry_eta):
    """A retry's ETA (core.due.retry_eta, by the database clock) as seconds from now."""
    from core.db import database_now_estimate

    return lambda attempt: retry_eta(attempt).timestamp() - database_now_estimate().timestamp()


# The one backoff (core.due.retry_countdown, sent as retry_eta), as each retried task uses it.
BACKOFFS = {
    "orders.expire_reservations": _delay_of(order_tasks.retry_eta),
    "payments.settle_payment": _delay_of(payment_tasks.retry_eta),
}


@pytest.mark.parametrize("name", sorted(BACKOFFS))
@pytest.mark.parametrize("jitter", ["low", "high", "random"])
def test_every_retry_countdown_and_its_run_end_inside_the_visibility_timeout(
    name, jitter, monkeypatch
):
    """For every attempt (far beyond max_retries) and the extremes of the jitter."""
    backoff = BACKOFFS[name]
    if jitter != "random":
        monkeypatch.setattr(random, "uniform", lambda a, b: a if jitter == "low" else b)
    limit = registered_tasks()[name].time_limit or app.conf.task_time_limit
    for attempt in range(200):
        countdown = backoff(attempt)
        assert 0 <= countdown <= settings.CELERY_MAX_COUNTDOWN + 0.01, (attempt, countdown)
        assert countdown + limit < visibility_timeout(), (attempt, countdown)


def test_every_periodic_task_expires_after_about_one_interval():
    """After a worker outage the queued ticks are dropped, not run back to back."""
    assert settings.CELERY_BEAT_SCHEDULE
    for entry_name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        schedule = entry["schedule"]
        # A crontab (the nightly sales report) runs once a day at most.
        interval = 86400.0 if isinstance(schedule, crontab) else float(schedule)
        expires = entry.get("options", {}).get("expires")
        assert expires is not None, entry_name
        assert 0 < float(expires) <= interval, entry_name


# -- a real worker whose process is killed mid-task ----------------------------------------------

LOCK_TTL = 2


def _abandoned(key_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (leased_at IS NULL OR leased_at < now() - make_interval(secs => %s))"
            " AND last_run_at < now() - make_interval(secs => %s)"
            " FROM idempotency_idempotencykey WHERE id = %s",
            [LOCK_TTL, LOCK_TTL, key_id],
        )
        row = cursor.fetchone()
    return bool(row and row[0])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("broker", ["redis", pytest.param("amqp", marks=pytest.mark.rabbitmq)])
def test_a_task_whose_worker_process_is_killed_is_redelivered(
    gunicorn, celery_worker_process, stub_service, shopper, broker
):
    """The completer's process is SIGKILLed mid-key; the one message we sent runs again
    (nothing else enqueues it: no beat) and finishes the key, with one effect. On Redis
    and on RabbitMQ (acks late + reject on worker lost on both)."""
    on_amqp: dict[str, str] = {}
    if broker == "amqp":
        rabbitmq.require()
        rabbitmq.purge()
        on_amqp["CELERY_BROKER_URL"] = rabbitmq.RABBITMQ_URL
    token = api_token_issue(user=shopper).key
    server = gunicorn(
        failpoints="probe.run.recorded.after_commit=exit@1",
        IDEMPOTENCY_LEASE_TTL=str(LOCK_TTL),
        SHOP_PROBE_STUB_URL=stub_service.url,
    )
    with pytest.raises(requests.ConnectionError):
        requests.post(
            server.url + "/api/v1/_test/probe/",
            json={"label": "lost", "amount": 3},
            headers={"Authorization": f"Token {token}", "Idempotency-Key": "redeliver"},
            timeout=30,
        )
    key_id = IdempotencyKey.objects.get().pk
    worker = celery_worker_process(
        # The first completer run stalls after its outside call, holding the key.
        failpoints="probe.run.after_call=sleep:120000@1",
        IDEMPOTENCY_LEASE_TTL=str(LOCK_TTL),
        IDEMPOTENCY_ABANDON_AFTER=str(LOCK_TTL),
        SHOP_PROBE_STUB_URL=stub_service.url,
        **on_amqp,
    )
    wait_until(lambda: _abandoned(key_id), timeout=30)
    if broker == "amqp":
        rabbitmq.send_task("idempotency.complete_abandoned_keys")
    else:
        app.send_task("idempotency.complete_abandoned_keys")
    wait_until(lambda: stub_service.calls, timeout=60, message=worker.log())
    assert IdempotencyKey.objects.get().runs == 2  # the worker took it over
    # Its lock expires while it stalls, so a redelivered run may take over at once.
    wait_until(lambda: _abandoned(key_id), timeout=30)
    children = psutil.Process(worker.process.pid).children(recursive=True)
    assert len(children) == 1, children  # concurrency 1: the pool process running the task
    children[0].send_signal(signal.SIGKILL)
    wait_until(
        lambda: IdempotencyKey.objects.filter(pk=key_id, recovery_point=FINISHED).exists(),
        timeout=60,
        message=worker.log(),
    )
    row = IdempotencyKey.objects.get()
    assert row.runs == 3 and row.response_status == 201
    assert "WorkerLostError" in worker.log() or "SIGKILL" in worker.log()
    record = ProbeRecord.objects.get()
    assert record.status == "completed"
    assert len(stub_service.effects) == 1
    assert OutboxMessage.objects.count() == 1
