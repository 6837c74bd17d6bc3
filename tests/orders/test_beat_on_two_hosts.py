"""Beat on every host (docs/deployment.md): every periodic task is safe to run twice at once.

Two hosts run two beats, so each tick of every entry of CELERY_BEAT_SCHEDULE
may reach the workers twice at the same moment. For each entry, two threads
(own connections, released by a barrier) run the task on seeded pending work
and the effect happens once: each due row rung once, each message published
once, each purge deleting each row once, nothing raising. Two entries are
covered by existing race tests (EXISTING); the guard test fails when a beat
entry is added without being listed here.
"""

from __future__ import annotations

import importlib
import threading
import uuid
from collections import Counter
from datetime import timedelta
from decimal import Decimal

import pytest
from django.conf import settings
from django.db.models.functions import Now

from config.celery import app
from core.api_tokens import api_token_issue
from core.due import sweeper
from core.models import ApiToken
from idempotency import keys
from idempotency.keys import KeyRun
from idempotency.models import FINISHED, Delivery, IdempotencyKey, OutboxMessage
from orders.models import CompensationStep
from payments.capture import payment_capture, payment_create
from payments.models import PaymentSettlement, Refund
from shop import emails
from shop.models import Mail
from tests.concurrency import Workers
from tests.idempotency.test_keys import age_lock, claim
from tests.idempotency.test_relay import write_orders
from tests.orders.compensation_support import paid_order
from tests.payments.refund_support import captured
from tests.payments.test_refunds import ask
from tests.shop.test_emails import order_payload
from tests.support.probe import answers_by_itself

pytestmark = pytest.mark.django_db(transaction=True)

# Entries whose two-at-once test already exists elsewhere (module:function).
EXISTING = {
    # orders_expire_due: each order's row lock decides; one sweeper expires it.
    "orders.expire_reservations": (
        "tests.orders.test_services:test_two_sweepers_at_once_expire_each_order_once"
    ),
    # Each day's row is taken by one run's attempt (core.due.attempt_begin); two
    # pipelines for one day would still publish one report (its constraint and lock).
    "reports.make_days": "tests.reports.test_catch_up:test_two_runs_at_once_make_each_day_once",
}
COVERED_HERE = {
    "idempotency-relay-outbox",
    "idempotency-sweep-deliveries",
    "idempotency-purge-outbox",
    "idempotency-complete-abandoned-keys",
    "idempotency-purge-finished-keys",
    "payments.sweep_settlements",
    "payments.sweep_refunds",
    "orders.sweep_compensation",
    "shop.sweep_mail",
    "shop.purge_mail",
    "idempotency-purge-inbox",
    "core.clear_expired_sessions",
    "shop.purge_api_tokens",
}


def test_every_beat_entry_is_proven_safe_to_run_on_two_hosts_at_once():
    schedule = settings.CELERY_BEAT_SCHEDULE
    assert set(schedule) == COVERED_HERE | set(EXISTING), (
        "a beat entry was added or removed: prove it safe twice at once here"
    )
    for node in EXISTING.values():
        module, name = node.split(":")
        assert callable(getattr(importlib.import_module(module), name)), node


def twice_at_once(task_name: str) -> list:
    """Run beat's task `task_name` in two threads released together; return both results."""
    app.loader.import_default_modules()
    task = app.tasks[task_name]
    barrier = threading.Barrier(2)
    workers = Workers()

    def tick():
        barrier.wait(10)
        return task.apply(throw=True).get()

    workers.start(tick)
    workers.start(tick)
    return workers.join()


@pytest.fixture
def rung(monkeypatch) -> Counter:
    """Every bell a sweeper rings (task name, row id), instead of publishing it."""
    bells: Counter = Counter()
    lock = threading.Lock()

    class Bell:
        def __init__(self, name: str) -> None:
            self.name = name

        def delay(self, pk) -> None:
            with lock:
                bells[(self.name, str(pk))] += 1

    monkeypatch.setattr(sweeper, "registered_task", lambda name: Bell(name))
    return bells


@pytest.fixture
def published(monkeypatch) -> Counter:
    """Every task the relay publishes (task name, message id), instead of the broker."""
    sent: Counter = Counter()
    lock = threading.Lock()

    def send_task(name, args=None, **kwargs):
        # The relay rings once per batch of a consumer's ids (a list); a bell carries one id.
        ids = args[0] if isinstance(args[0], list) else [args[0]]
        with lock:
            for message_id in ids:
                sent[(name, str(message_id))] += 1

    monkeypatch.setattr(app, "send_task", send_task)
    return sent


def _entry(name: str) -> str:
    return settings.CELERY_BEAT_SCHEDULE[name]["task"]


def _rang_each_once(bells: Counter, task: str, ids) -> None:
    assert {pk for (name, pk) in bells if name == task} == {str(pk) for pk in ids}
    assert set(bells.values()) == {1}, bells


def test_two_relays_from_beat_publish_each_message_once(shopper, published):
    ids = write_orders(shopper, 30)
    results = twice_at_once(_entry("idempotency-relay-outbox"))
    assert sum(results) == 30
    assert not OutboxMessage.objects.filter(done_at__isnull=True).exists()
    assert {message for (_, message) in published} == set(ids)
    assert set(published.values()) == {1}  # no message published by both
    assert set(Delivery.objects.values_list("publishes", flat=True)) == {1}


def test_two_delivery_sweeps_publish_each_overdue_delivery_once_more(shopper, published):
    write_orders(shopper, 10)
    twice_at_once(_entry("idempotency-relay-outbox"))
    published.clear()
    Delivery.objects.update(lease_expires_at=Now())  # the delivery timeout passed undone
    results = twice_at_once(_entry("idempotency-sweep-deliveries"))
    assert sum(results) == Delivery.objects.count() == 20
    assert set(published.values()) == {1}
    assert set(Delivery.objects.values_list("publishes", flat=True)) == {2}


def test_two_outbox_purges_delete_each_message_once(shopper, published, settings):
    write_orders(shopper, 10)
    twice_at_once(_entry("idempotency-relay-outbox"))
    Delivery.objects.update(done_at=Now())
    settings.OUTBOX_RETENTION = 0.0
    assert sum(twice_at_once(_entry("idempotency-purge-outbox"))) == 10
    assert not OutboxMessage.objects.exists() and not Delivery.objects.exists()


@pytest.fixture
def resumed(settings, monkeypatch) -> Counter:
    """A registered operation whose resumer counts its effects, per key."""
    from idempotency.keys import operations

    monkeypatch.setattr(operations, "_operations", dict(operations._operations))
    settings.IDEMPOTENCY_ABANDON_AFTER = 60
    effects: Counter = Counter()
    lock = threading.Lock()

    def resume(run: KeyRun, present) -> None:
        with lock:
            effects[run.key] += 1
        with run.phase(next_point="done"):
            run.finish(status=201, body={"completed": run.key})

    keys.keyed_operation("test.beat", resume=resume)(answers_by_itself)
    return effects


def test_two_completers_finish_each_abandoned_key_once(shopper, resumed):
    names = [f"abandoned-{i}" for i in range(6)]
    for name in names:
        run = claim(shopper, name, operation="test.beat")
        assert isinstance(run, KeyRun)
        with run.phase(next_point="reserved"):
            pass
        age_lock(run.key_id, 120)
    assert sum(twice_at_once(_entry("idempotency-complete-abandoned-keys"))) == 6
    assert resumed == Counter({name: 1 for name in names})
    assert set(IdempotencyKey.objects.values_list("recovery_point", flat=True)) == {FINISHED}
    assert set(IdempotencyKey.objects.values_list("runs", flat=True)) == {2}


def test_two_key_purges_delete_each_finished_key_once(shopper, settings):
    for i in range(12):
        claim(shopper, f"done-{i}").finish(status=200, body={})
    IdempotencyKey.objects.update(finished_at=Now() - timedelta(days=3))
    settings.IDEMPOTENCY_KEY_RETENTION = 60.0
    assert sum(twice_at_once(_entry("idempotency-purge-finished-keys"))) == 12
    assert not IdempotencyKey.objects.exists()


def test_two_settlement_sweeps_ring_each_due_settlement_once(provider, rung):
    for i in range(4):
        payment = payment_create(
            reference=f"beat-{i}-{uuid.uuid4().hex[:6]}",
            amount=Decimal("8.00"),
            currency="EUR",
            payment_method="pm_card_timeout",
        )
        assert payment_capture(payment_id=payment.id).outcome == "unknown"
    PaymentSettlement.objects.update(next_attempt_at=Now(), lease_expires_at=None)
    rung.clear()
    assert sum(twice_at_once(_entry("payments.sweep_settlements"))) == 4
    _rang_each_once(
        rung, "payments.settle_payment", PaymentSettlement.objects.values_list("pk", flat=True)
    )


def test_two_refund_sweeps_ring_each_due_refund_once(provider, rung):
    for _ in range(3):
        ask(captured(amount="9.00"), "4.00")
    Refund.objects.update(next_attempt_at=Now(), lease_expires_at=None, done_at=None)
    rung.clear()
    assert sum(twice_at_once(_entry("payments.sweep_refunds"))) == 3
    _rang_each_once(rung, "payments.refund", Refund.objects.values_list("pk", flat=True))


def test_two_compensation_sweeps_ring_each_due_step_once(
    provider, make_product, shopper_client, rung, monkeypatch
):
    make_product("TEE-M", price="10.00", stock=10)
    order = paid_order(shopper_client, {"TEE-M": 2})
    monkeypatch.setattr(app, "send_task", lambda *a, **kw: None)  # no bells from the cancel
    response = shopper_client.post(
        f"/api/v1/orders/{order.id}/cancel/", format="json", HTTP_IDEMPOTENCY_KEY="beat-cancel"
    )
    assert response.status_code in (200, 202), response.content
    steps = CompensationStep.objects.filter(order=order)
    assert steps.exists()
    steps.update(next_attempt_at=Now(), lease_expires_at=None, done_at=None, needs_attention=False)
    rung.clear()
    assert sum(twice_at_once(_entry("orders.sweep_compensation"))) == steps.count()
    _rang_each_once(rung, "orders.compensation_step", steps.values_list("pk", flat=True))


def _mails(user, n: int) -> list[int]:
    for i in range(n):
        emails.email_apply(
            message_id=f"beat-mail-{i}", event_type="order.confirmed", payload=order_payload(user)
        )
    return list(Mail.objects.values_list("pk", flat=True))


def test_two_mail_sweeps_ring_each_due_mail_once(shopper, published):
    ids = _mails(shopper, 6)
    published.clear()  # the writes' own bells: lost, and their leases run out
    Mail.objects.update(lease_owner="", lease_expires_at=None)
    assert sum(twice_at_once(_entry("shop.sweep_mail"))) == 6
    assert {pk for (name, pk) in published if name == emails.SEND_TASK} == {str(pk) for pk in ids}
    assert set(published.values()) == {1}


def test_two_mail_purges_delete_each_sent_mail_once(shopper, published, settings):
    _mails(shopper, 6)
    Mail.objects.update(done_at=Now() - timedelta(hours=1))
    settings.SHOP_MAIL_RETENTION = 0.0
    assert sum(twice_at_once(_entry("shop.purge_mail"))) == 6
    assert not Mail.objects.exists()


def test_two_inbox_purges_delete_each_row_once(settings):
    from idempotency.models import InboxMessage

    for i in range(8):
        InboxMessage.objects.create(consumer="purchase_history", message_id=f"beat-{i}")
    InboxMessage.objects.update(received_at=Now() - timedelta(hours=1))
    settings.IDEMPOTENCY_INBOX_RETENTION = 60.0
    settings.IDEMPOTENCY_INBOX_PURGE_BATCH = 3
    assert sum(twice_at_once(_entry("idempotency-purge-inbox"))) == 8
    assert not InboxMessage.objects.exists()


def test_two_session_clears_delete_each_ended_session_once(settings):
    from importlib import import_module

    from core.models import Session

    store = import_module(settings.SESSION_ENGINE).SessionStore
    for _ in range(8):
        store().create()
    Session.objects.update(expire_date=Now() - timedelta(seconds=1))
    settings.SESSION_CLEAR_BATCH = 3
    assert sum(twice_at_once(_entry("core.clear_expired_sessions"))) == 8
    assert not Session.objects.exists()


def test_two_token_purges_delete_each_expired_token_once(make_user, settings):
    users = [make_user() for _ in range(3)]
    for user in users * 2:
        api_token_issue(user=user)
    ApiToken.objects.update(created=Now() - timedelta(hours=2))
    settings.API_TOKEN_LIFETIME = 3600
    assert sum(twice_at_once(_entry("shop.purge_api_tokens"))) == 6
    assert not ApiToken.objects.exists()
