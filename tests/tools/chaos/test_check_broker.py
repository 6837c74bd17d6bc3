"""The checker's broker reading (no database): RabbitMQ peeked without consuming, two reads."""

from __future__ import annotations

import os
import uuid

import pytest

from tools.chaos import invariants


def test_a_doorbell_taken_between_the_two_reads_is_not_left_over(monkeypatch):
    """With the workers running, a message rung a moment ago is on its way, not left."""
    rung = invariants.BrokerMessage("celery", "orders.compensation_step", "t1", None)
    reads = iter([[rung], []])
    monkeypatch.setattr(invariants, "BROKER_REREAD", 0.0)
    monkeypatch.setattr(invariants, "broker_messages", lambda **_: next(reads))
    result = invariants.check_broker()
    assert (result.checked, result.violations) == (1, [])


def test_the_checker_reads_every_queue_a_worker_consumes(settings):
    """A message left on any kind of work's queue is seen (docs/celery.md, "Queues")."""
    assert set(settings.SHOP_QUEUES) <= set(invariants._queues())


AMQP_URL = os.environ.get("CHAOS_CHECK_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/checker")


def test_on_rabbitmq_a_message_left_in_the_queue_is_reported_and_not_consumed(
    monkeypatch, settings
):
    from kombu import Connection, Exchange, Producer, Queue

    name = f"chaos-check-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(invariants, "_queues", lambda: [name, f"{name}-never-declared"])
    monkeypatch.setattr(invariants, "BROKER_REREAD", 0.05)
    settings.CELERY_BROKER_URL = AMQP_URL
    try:
        conn = Connection(AMQP_URL, connect_timeout=3)
        conn.connect()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no RabbitMQ at {AMQP_URL}: {exc}")
    queue = Queue(name, Exchange(name, type="direct"), routing_key=name, auto_delete=False)
    try:
        assert invariants.check_broker().violations == []
        Producer(conn.channel(), exchange=queue.exchange, routing_key=name).publish(
            {}, headers={"task": "payments.refund", "id": "left-1"}, declare=[queue]
        )
        for _ in range(2):  # read twice: the first read gave it back
            violations = invariants.check_broker().violations
            assert violations == [f"left in the broker: {name}: payments.refund left-1"]
        assert [m.task_id for m in invariants.broker_messages(peek=False)] == ["(not read)"]
    finally:
        queue(conn.channel()).delete()
        conn.release()
