"""A return's compensation run, driven in this process against the real simulator.

Each step once: stock back once, one refund at the provider under the derived
refund id, one `return.completed` outbox row, the return `completed` once;
transient failures back off and finish; a spent budget or a refused refund
is `needs_attention` until staff "Retry failed steps".
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from celery import current_app
from django.core import mail
from django.db import connection
from django.db.models.functions import Now

from idempotency.failpoints import hook
from idempotency.models import OutboxMessage
from inventory.models import StockItem
from orders.compensation import return_refund_id, steps_retry_failed
from orders.models import CompensationStep, OrderEvent, ReturnRequest
from payments.models import Refund
from payments.refund_decisions import refund_record_outside
from tests.orders.compensation_support import (
    ask_return,
    drive,
    receive,
    shipped_order,
    steps_of,
)
from tests.payments.refund_support import provider_refunds
from tests.support.simulator import assert_reconciled

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def bells(monkeypatch, settings):
    settings.COMPENSATION_BACKOFF_BASE = 0.01
    settings.COMPENSATION_BACKOFF_MAX = 0.05
    settings.COMPENSATION_WAIT_SECONDS = 0.01
    rung: list = []
    monkeypatch.setattr(current_app, "send_task", lambda name, args=None, **kw: rung.append(args))
    return rung


@pytest.fixture
def received(provider, make_product, shopper_client, staff_client):
    """A shipped order (2 × 10.00 + 1 × 5.50) with a received return of one TEE-M and the CAP."""
    make_product("TEE-M", price="10.00", stock=10)
    make_product("CAP", price="5.50", stock=10)
    order = shipped_order(shopper_client, {"TEE-M": 2, "CAP": 1})
    return_id = ask_return(shopper_client, order, {"TEE-M": 1, "CAP": 1}).json()["id"]
    assert receive(staff_client, return_id).status_code == 202
    return ReturnRequest.objects.select_related("order").get(id=return_id)


def on_hand(sku: str) -> int:
    return StockItem.objects.get(product__sku=sku).on_hand


def assert_compensated_once(ret, provider) -> None:
    ret.refresh_from_db()
    assert ret.status == "completed"
    assert on_hand("TEE-M") == 9 and on_hand("CAP") == 10  # 10 − 2 − 1 sold, 1 + 1 back
    refunds = provider_refunds(provider)
    assert len(refunds) == 1 and Decimal(refunds[0]["amount"]) == Decimal("15.50")
    refund = Refund.objects.get()
    assert refund.id == return_refund_id(ret.id) and refund.origin == "return"
    events = OutboxMessage.objects.filter(event_type="return.completed")
    assert events.count() == 1
    payload = events.get().payload
    assert payload["return_id"] == str(ret.id) and payload["owner_id"] == ret.order.owner_id
    assert sorted((ln["sku"], ln["quantity"], ln["unit_price"]) for ln in payload["lines"]) == [
        ("CAP", 1, "5.50"),
        ("TEE-M", 1, "10.00"),
    ]
    assert OrderEvent.objects.filter(kind="return_completed").count() == 1
    assert {s.status for s in steps_of(order_return=ret)} == {"done"}
    assert_reconciled()


def test_the_run_completes_every_step_once(received, provider):
    drive(order_return=received)
    assert_compensated_once(received, provider)
    assert len(mail.outbox) == 1 and received.order.owner.email in mail.outbox[0].to
    # Running every step again changes nothing: each is done.
    from orders.compensation import step_run

    for step in steps_of(order_return=received):
        assert step_run(step_id=step.id) == "not due"
    assert_compensated_once(received, provider)


def test_only_the_steps_that_wait_for_none_are_rung_at_the_start(
    provider, make_product, shopper_client, staff_client, bells
):
    make_product("TEE-M", price="10.00", stock=10)
    order = shipped_order(shopper_client, {"TEE-M": 1})
    return_id = ask_return(shopper_client, order, {"TEE-M": 1}).json()["id"]
    bells.clear()
    assert receive(staff_client, return_id).status_code == 202
    steps = {s.name: s for s in steps_of(order_return_id=return_id)}
    assert sorted(bells) == sorted([[steps["restock"].id], [steps["refund"].id]])
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, attempts, last_error, next_attempt_at - now() > interval '50 seconds'"
            " FROM orders_compensationstep WHERE order_return_id = %s AND after <> ''",
            [return_id],
        )
        waiting = sorted(cursor.fetchall())
    # Waiting from the start (the sweeper's safety net is COMPENSATION_AFTER_RECHECK away);
    # the refund step's done makes them due and rings them (test_compensation_fencing.py,
    # test_a_waiting_step_is_not_polled_and_the_step_before_wakes_it).
    assert waiting == [(name, 0, "", True) for name in ("history", "loyalty", "notify")]
    drive(order_return_id=return_id)
    assert {s.status for s in steps_of(order_return_id=return_id)} == {"done"}
    assert len(mail.outbox) == 1


def test_event_steps_wait_for_the_refund(received, provider):
    from orders.compensation import step_run

    history = steps_of(order_return=received).get(name="history")
    CompensationStep.objects.filter(id=history.id).update(
        next_attempt_at=Now()
    )  # the sweeper's look
    assert step_run(step_id=history.id) == "waiting"
    history.refresh_from_db()
    assert history.attempts == 0 and history.status == "pending"
    assert not OutboxMessage.objects.filter(event_type="return.completed").exists()


def test_refund_step_failing_transiently_three_times_completes(received, provider):
    failures = []

    def flaky(_name):
        if len(failures) < 3:
            failures.append(1)
            raise ConnectionError("provider blinked")

    with hook("compensation.refund.before_effect", flaky):
        drive(order_return=received)
    step = steps_of(order_return=received).get(name="refund")
    assert len(failures) == 3 and step.attempts >= 4
    assert_compensated_once(received, provider)


def test_budget_spent_needs_attention_then_retry_failed_steps(received, provider, settings):
    settings.COMPENSATION_MAX_ATTEMPTS = 3

    def down(_name):
        raise ConnectionError("provider down")

    with hook("compensation.refund.before_effect", down):
        drive(order_return=received)
    received.refresh_from_db()
    assert received.status == "needs_attention"
    step = steps_of(order_return=received).get(name="refund")
    assert step.status == "failed" and step.needs_attention and step.attempts == 3
    assert "provider down" in step.last_error
    assert steps_of(order_return=received).get(name="restock").status == "done"
    assert provider_refunds(provider) == []
    # The cause is fixed (no hook); staff retry, twice (a double click).
    assert steps_retry_failed(step_ids=[step.id]) == 1
    assert steps_retry_failed(step_ids=[step.id]) == 0
    received.refresh_from_db()
    assert received.status == "processing"
    drive(order_return=received)
    assert_compensated_once(received, provider)


def test_refused_refund_needs_attention_until_staff_resolve_it(received, provider, bells):
    provider.faults(decline_refunds=True)
    drive(order_return=received)
    received.refresh_from_db()
    assert received.status == "needs_attention"
    step = steps_of(order_return=received).get(name="refund")
    assert step.status == "failed" and "needs_attention" in step.last_error
    assert not OutboxMessage.objects.filter(event_type="return.completed").exists()
    # The steps behind it are parked: not due for an hour, and no bell rings
    # them meanwhile (polling every backoff would loop until staff act).
    from orders.compensation import step_run

    history = steps_of(order_return=received).get(name="history")
    CompensationStep.objects.filter(id=history.id).update(next_attempt_at=Now())
    bells.clear()
    assert step_run(step_id=history.id) == "parked"
    assert bells == []
    assert step_run(step_id=history.id) == "not due"
    assert CompensationStep.objects.filter(
        id=history.id, next_attempt_at__gt=Now() + timedelta(minutes=50)
    ).exists()
    # Staff pay it back outside the shop, then retry the return's failed steps.
    refund = Refund.objects.get()
    assert refund_record_outside(refund_id=refund.id)
    steps_retry_failed(step_ids=[step.id])
    drive(order_return=received)
    received.refresh_from_db()
    assert received.status == "completed"
    assert Refund.objects.count() == 1
    assert OutboxMessage.objects.filter(event_type="return.completed").count() == 1


def test_a_step_that_failed_rings_for_later_by_the_database_clock(received, provider, monkeypatch):
    """A failed attempt rings its step for after the backoff with an ETA taken from the
    database clock, never a Celery countdown: a countdown becomes an ETA on the
    sending host's clock, which another host's worker judges by its own (the chaos
    run's host 5 minutes ahead made the other host's workers hold its rings 5
    minutes). Here this process's clock runs 5 minutes ahead of the database's."""
    import time as time_module

    from core.db import database_now

    real_time = time_module.time
    monkeypatch.setattr(time_module, "time", lambda: real_time() + 300)
    sent: list[dict] = []
    monkeypatch.setattr(
        current_app, "send_task", lambda name, args=None, **options: sent.append(options)
    )
    failures: list[int] = []

    def flaky(_name):
        if not failures:
            failures.append(1)
            raise ConnectionError("provider blinked")

    with hook("compensation.refund.before_effect", flaky):
        drive(order_return=received)
    assert failures == [1]
    later = [o for o in sent if "eta" in o or "countdown" in o]  # the rings for later
    assert later and not [o for o in later if "countdown" in o], sent
    db_now = database_now().timestamp()
    for options in later:  # within the capped backoff of the database clock, not 5 min on
        assert db_now - 60 < options["eta"].timestamp() < db_now + 60, options
    assert_compensated_once(received, provider)
