"""One refund budget shared by goodwill refunds, returns and a cancellation (issue 20).

What is still refundable = captured − refunded − refunds in progress
(`payments.refunds.refundable`). A return refunds its lines' value capped at
that when its refund step runs (0.00: nothing to refund, and the run still
completes); a cancellation waits for refunds in progress to end, then refunds
everything not refunded; a step whose refund staff recorded as failed asks
again under the step's next derived refund id.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from celery import current_app
from django.core import mail

from idempotency.models import OutboxMessage
from orders.compensation import (
    cancellation_refund_id,
    return_refund_id,
    step_run,
    steps_retry_failed,
)
from orders.models import CompensationStep, Order, ReturnRequest
from orders.services import order_cancel
from payments.models import Payment, Refund, RefundOrigin, RefundStatus
from payments.refund_decisions import refund_record_failed
from payments.refunds import refund_request, refund_run
from shop.loyalty import loyalty_apply, loyalty_get
from tests.orders.compensation_support import (
    RETURN,
    ask_return,
    drive,
    paid_order,
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
    monkeypatch.setattr(current_app, "send_task", lambda *a, **kw: None)


@pytest.fixture
def products(make_product):
    make_product("TEE-M", price="10.00", stock=10)
    make_product("CAP", price="5.50", stock=10)
    make_product("COAT", price="100.00", stock=10)


def goodwill(order, amount: str, *, run: bool = True) -> Refund:
    refund = refund_request(
        refund_id=uuid.uuid4(),
        payment_id=order.payment_id,
        amount=Decimal(amount),
        reason="goodwill",
        origin=RefundOrigin.GOODWILL,
    )
    if run:
        refund = refund_run(refund_id=refund.id)
        assert refund.status == RefundStatus.SUCCEEDED
    return refund


def points_of(user) -> int:
    """Apply every outbox event to the shopper's points (the consumer's job) and read them."""
    for message in OutboxMessage.objects.order_by("created_at", "id"):
        loyalty_apply(
            event_id=str(message.id), event_type=message.event_type, payload=message.payload
        )
    return loyalty_get(user=user)[0]


def payment_of(order) -> Payment:
    return Payment.objects.get(id=order.payment_id)


def received_return(shopper_client, staff_client, order, lines) -> ReturnRequest:
    return_id = ask_return(shopper_client, order, lines).json()["id"]
    assert receive(staff_client, return_id).status_code == 202
    return ReturnRequest.objects.get(id=return_id)


def test_a_return_after_goodwill_refunds_what_is_left(
    products, provider, shopper, shopper_client, staff_client
):
    """The issue's case: 25.50 captured, goodwill 20.00, a return of 15.50 → refunds 5.50."""
    order = shipped_order(shopper_client, {"TEE-M": 2, "CAP": 1})
    goodwill(order, "20.00")
    ret = received_return(shopper_client, staff_client, order, {"TEE-M": 1, "CAP": 1})
    # Until its refund step ran, the return's refund amount is its lines' value.
    assert shopper_client.get(RETURN.format(ret.id)).json()["refund_amount"] == "15.50"
    drive(order_return=ret)
    ret.refresh_from_db()
    assert ret.status == "completed", [(s.name, s.last_error) for s in steps_of(order_return=ret)]
    body = shopper_client.get(RETURN.format(ret.id)).json()
    assert body["refund_amount"] == "5.50"
    refund = Refund.objects.get(id=return_refund_id(ret.id))
    assert refund.amount == Decimal("5.50") and refund.status == RefundStatus.SUCCEEDED
    payment = payment_of(order)
    assert payment.amount_refunded == payment.amount_captured == Decimal("25.50")
    assert payment.status == "refunded"
    assert OutboxMessage.objects.filter(event_type="return.completed").count() == 1
    assert len(mail.outbox) == 1
    assert points_of(shopper) == 25 - 10 - 5
    assert_reconciled()


def test_a_return_after_goodwill_of_everything_refunds_nothing_and_completes(
    products, provider, shopper, shopper_client, staff_client
):
    order = shipped_order(shopper_client, {"TEE-M": 2, "CAP": 1})
    goodwill(order, "25.50")
    ret = received_return(shopper_client, staff_client, order, {"TEE-M": 1, "CAP": 1})
    drive(order_return=ret)
    ret.refresh_from_db()
    assert ret.status == "completed", [(s.name, s.last_error) for s in steps_of(order_return=ret)]
    assert shopper_client.get(RETURN.format(ret.id)).json()["refund_amount"] == "0.00"
    # Nothing to refund: no refund row and no provider call (a refund's amount is positive).
    assert not Refund.objects.filter(origin=RefundOrigin.RETURN).exists()
    assert len(provider_refunds(provider)) == 1
    step = steps_of(order_return=ret).get(name="refund")
    assert step.status == "done" and step.detail["amount"] == "0.00"
    assert OutboxMessage.objects.filter(event_type="return.completed").count() == 1
    assert len(mail.outbox) == 1
    assert points_of(shopper) == 25 - 10 - 5
    assert_reconciled()


def test_a_return_whose_goodwill_is_still_in_progress_is_capped_too(
    products, provider, shopper_client, staff_client
):
    """A goodwill refund not yet answered holds its amount: the return gets the rest."""
    order = shipped_order(shopper_client, {"TEE-M": 2, "CAP": 1})
    pending = goodwill(order, "20.00", run=False)
    ret = received_return(shopper_client, staff_client, order, {"TEE-M": 1, "CAP": 1})
    for step in steps_of(order_return=ret).filter(name__in=["restock", "refund"]):
        step_run(step_id=step.id)
    assert Refund.objects.get(id=return_refund_id(ret.id)).amount == Decimal("5.50")
    refund_run(refund_id=pending.id)
    drive(order_return=ret)
    ret.refresh_from_db()
    assert ret.status == "completed"
    payment = payment_of(order)
    assert payment.amount_refunded == payment.amount_captured
    assert_reconciled()


# -- the cancellation waits for refunds in progress (finding 2) -----------------------------------


def run_cancellation_steps(order) -> None:
    for step in steps_of(order=order, kind="cancellation"):
        CompensationStep.objects.filter(id=step.id).update(next_attempt_at=step.created_at)
        step_run(step_id=step.id)


def test_a_cancellation_waits_for_a_goodwill_refund_that_is_then_declined(
    products, provider, shopper, shopper_client
):
    order = paid_order(shopper_client, {"COAT": 1})
    pending = goodwill(order, "30.00", run=False)
    order_cancel(order_id=order.id)
    run_cancellation_steps(order)
    refund_step = steps_of(order=order, kind="cancellation").get(name="refund")
    # It waits as due work: no refund of its own yet, due again later, not an attempt.
    assert refund_step.done_at is None and refund_step.status == "pending"
    assert refund_step.attempts == 0 and "in progress" in refund_step.last_error
    assert not Refund.objects.filter(origin=RefundOrigin.CANCELLATION).exists()
    # The goodwill refund is declined; staff record it as failed (its 30 is released).
    provider.faults(decline_refunds=True)
    refund_run(refund_id=pending.id)
    assert Refund.objects.get(id=pending.id).status == RefundStatus.NEEDS_ATTENTION
    provider.faults(decline_refunds=False)
    assert refund_record_failed(refund_id=pending.id)
    drive(order=order, kind="cancellation")
    order.refresh_from_db()
    assert order.status == "cancelled"
    payment = payment_of(order)
    assert payment.amount_refunded == payment.amount_captured == Decimal("100.00")
    assert payment.status == "refunded"
    assert Refund.objects.get(id=cancellation_refund_id(order.id)).amount == Decimal("100.00")
    assert OutboxMessage.objects.filter(event_type="order.cancelled").count() == 1
    assert points_of(shopper) == 0
    assert_reconciled()


def test_a_cancellation_waits_for_a_goodwill_refund_that_then_succeeds(
    products, provider, shopper_client
):
    order = paid_order(shopper_client, {"COAT": 1})
    pending = goodwill(order, "30.00", run=False)
    order_cancel(order_id=order.id)
    run_cancellation_steps(order)
    assert not Refund.objects.filter(origin=RefundOrigin.CANCELLATION).exists()
    refund_run(refund_id=pending.id)
    drive(order=order, kind="cancellation")
    order.refresh_from_db()
    assert order.status == "cancelled"
    payment = payment_of(order)
    assert payment.amount_refunded == payment.amount_captured == Decimal("100.00")
    assert Refund.objects.get(id=cancellation_refund_id(order.id)).amount == Decimal("70.00")
    assert_reconciled()


# -- "Record as failed" on a refund a step owns (finding 1) -----------------------------------


def test_a_return_whose_refund_staff_record_as_failed_asks_again_and_completes(
    products, provider, shopper, shopper_client, staff_client
):
    order = shipped_order(shopper_client, {"TEE-M": 2, "CAP": 1})
    ret = received_return(shopper_client, staff_client, order, {"TEE-M": 1, "CAP": 1})
    provider.faults(decline_refunds=True)
    drive(order_return=ret)
    ret.refresh_from_db()
    assert ret.status == "needs_attention"
    first = Refund.objects.get(id=return_refund_id(ret.id))
    assert first.status == RefundStatus.NEEDS_ATTENTION
    provider.faults(decline_refunds=False)
    assert refund_record_failed(refund_id=first.id)
    step = steps_of(order_return=ret).get(name="refund")
    assert steps_retry_failed(step_ids=[step.id]) == 1
    drive(order_return=ret)
    ret.refresh_from_db()
    assert ret.status == "completed"
    from orders.compensation import step_refund_id

    second = Refund.objects.get(id=step_refund_id(step, generation=1))
    assert second.id != first.id and second.amount == Decimal("15.50")
    assert second.status == RefundStatus.SUCCEEDED
    assert shopper_client.get(RETURN.format(ret.id)).json()["refund_amount"] == "15.50"
    assert payment_of(order).amount_refunded == Decimal("15.50")
    assert OutboxMessage.objects.filter(event_type="return.completed").count() == 1
    assert points_of(shopper) == 25 - 10 - 5
    assert_reconciled()


def test_a_cancellation_whose_refund_staff_record_as_failed_asks_again_and_completes(
    products, provider, shopper, shopper_client
):
    order = paid_order(shopper_client, {"TEE-M": 2, "CAP": 1})
    order_cancel(order_id=order.id)
    provider.faults(decline_refunds=True)
    drive(order=order, kind="cancellation")
    first = Refund.objects.get(id=cancellation_refund_id(order.id))
    assert first.status == RefundStatus.NEEDS_ATTENTION
    assert Order.objects.get(id=order.id).status == "cancelling"
    provider.faults(decline_refunds=False)
    assert refund_record_failed(refund_id=first.id)
    step = steps_of(order=order, kind="cancellation").get(name="refund")
    assert steps_retry_failed(step_ids=[step.id]) == 1
    drive(order=order, kind="cancellation")
    order.refresh_from_db()
    assert order.status == "cancelled"
    payment = payment_of(order)
    assert payment.amount_refunded == payment.amount_captured == Decimal("25.50")
    from orders.compensation import step_refund_id

    assert Refund.objects.get(id=step_refund_id(step, generation=1)).amount == Decimal("25.50")
    assert OutboxMessage.objects.filter(event_type="order.cancelled").count() == 1
    assert points_of(shopper) == 0
    assert_reconciled()
