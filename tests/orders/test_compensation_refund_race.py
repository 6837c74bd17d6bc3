"""A goodwill refund racing a cancellation's refund step (issue 32, finding 8).

A cancellation is `cancelled` only when `amount_refunded = amount_captured`
(docs/compensation.md, "One refund budget"). The refund step reads "refunds
in progress" and the budget under the payment's row lock — the lock a
refund request takes — and asks for the rest in the same transaction, so a
goodwill refund asked meanwhile either comes first (the step waits for it)
or after (it finds nothing refundable: 422). The transaction that writes
`cancelled` checks refunded = captured under that lock too; a refund step
found done with money left is asked again (reopened), never a dead end.

The wrong twin is the read path before: one unlocked read, then a capped
request. A goodwill refund of everything between the two leaves the step
done with nothing refunded; declined and recorded failed, it leaves a
`cancelled` order that refunded 0.
"""

from __future__ import annotations

import threading
import uuid
from decimal import Decimal

import pytest
from django.db import transaction
from django.db.models.functions import Now

from core.errors import ApplicationError
from idempotency.failpoints import failpoint, hook
from orders.compensation import run as compensation_run
from orders.compensation import state as compensation_state
from orders.compensation import step_run
from orders.compensation.refund import (
    MAX_REFUND_GENERATIONS,
    _refund_done,
    cancellation_refund_id,
    step_refund_id,
)
from orders.compensation.state import StepNeedsAttention, step_wait
from orders.models import CompensationStep, Order, OrderEvent
from orders.services import order_cancel
from orders.states import StepName, StepStatus
from orders.transitions import order_transition
from payments import refunds as payment_refunds
from payments import selectors as payment_selectors
from payments.errors import RefundExceedsCaptured
from payments.models import Payment, Refund, RefundOrigin, RefundStatus
from payments.refund_decisions import refund_record_failed
from payments.refunds import refund_request, refund_run
from tests.concurrency import Workers, lock_waiters, wait_for_lock_waiters, wait_until
from tests.orders.compensation_support import drive, paid_order, steps_of
from tests.payments.refund_support import provider_refunds
from tests.support.simulator import assert_reconciled

pytestmark = pytest.mark.django_db(transaction=True)

# The fast backoffs and the captured bell of the compensation tests.
from tests.orders.test_compensation_budget import bells  # noqa: E402,F401

TIMEOUT = 20
BUDGET_READ = "compensation.refund.budget_read"


@pytest.fixture
def cancelling(provider, make_product, shopper_client) -> Order:
    """A paid order of one COAT (100.00), just cancelled: its five steps pending."""
    make_product("COAT", price="100.00", stock=10)
    order = paid_order(shopper_client, {"COAT": 1})
    assert order_cancel(order_id=order.id).cancel_started
    return order


def refund_step(order) -> CompensationStep:
    return steps_of(order=order, kind="cancellation").get(name=StepName.REFUND)


def payment_of(order) -> Payment:
    return Payment.objects.get(id=order.payment_id)


def goodwill(order, amount: str) -> Refund | ApplicationError:
    """Staff's goodwill refund (what `POST /orders/{id}/refunds/` asks); a refusal returned."""
    try:
        return refund_request(
            refund_id=uuid.uuid4(),
            payment_id=order.payment_id,
            amount=Decimal(amount),
            reason="goodwill",
            origin=RefundOrigin.GOODWILL,
        )
    except ApplicationError as exc:
        return exc


class Stall:
    """Make a worker thread that reaches failpoint `name` stall there until released."""

    def __init__(self) -> None:
        self.stalled = threading.Event()
        self.release = threading.Event()

    def __call__(self, _name: str) -> None:
        if threading.current_thread() is threading.main_thread():
            return
        self.stalled.set()
        assert self.release.wait(TIMEOUT)


def goodwill_while_the_step_reads(order, amount: str) -> tuple[Refund | ApplicationError, bool]:
    """The refund step (a thread) has read the budget and stalls there; a goodwill refund of
    `amount` (another thread) is asked meanwhile. Return the goodwill's answer and whether it
    had to wait for a lock the step held (the overlap)."""
    row = refund_step(order)
    CompensationStep.objects.filter(id=row.id).update(next_attempt_at=Now())
    stall = Stall()
    steps, asks = Workers(), Workers()
    with hook(BUDGET_READ, stall):
        steps.start(step_run, step_id=row.id)
        assert stall.stalled.wait(TIMEOUT)
        asking = asks.start(goodwill, order, amount)
        seen = wait_until(
            lambda: "waits" if lock_waiters() else ("answered" if not asking.is_alive() else None),
            timeout=TIMEOUT,
            what="the goodwill refund waits for a lock or is answered",
        )
        stall.release.set()
        steps.join()
        (asked,) = asks.join()
    return asked, seen == "waits"


def decline_and_record_failed(provider) -> list[Refund]:
    """The provider declines every goodwill refund in progress; staff record each as failed."""
    provider.faults(decline_refunds=True)
    pending = list(Refund.objects.filter(origin=RefundOrigin.GOODWILL, status="pending"))
    for refund in pending:
        Refund.objects.filter(id=refund.id).update(next_attempt_at=Now())
        assert refund_run(refund_id=refund.id).status == RefundStatus.NEEDS_ATTENTION
        assert refund_record_failed(refund_id=refund.id)
    provider.faults(decline_refunds=False)
    return pending


# -- the wrong twins: the read path and the completion before -------------------------------


def unlocked_refund(step: CompensationStep, attempt) -> str:
    """WRONG (the cancellation's refund step before): "in progress" and the cap are read on one
    unlocked read of the payment, then `refund_request_capped` sizes the request; when a refund
    took the whole budget in between, nothing is refundable and the step is done."""
    succeeded = []
    for generation in range(MAX_REFUND_GENERATIONS):
        refund_id = step_refund_id(step, generation=generation)
        refund = payment_selectors.refund_get_or_none(refund_id=refund_id)
        if refund is None:
            break
        if refund.status == RefundStatus.FAILED:
            continue
        if refund.status == RefundStatus.SUCCEEDED:
            succeeded.append(refund)
            continue
        if refund.status == RefundStatus.NEEDS_ATTENTION:
            raise StepNeedsAttention(f"refund {refund.id} needs attention")
        step_wait(step_id=step.id, attempt=attempt, seconds=0.01, note="waiting for the refund")
        return "waiting"
    payment = Payment.objects.get(id=Order.objects.get(id=step.order_id).payment_id)
    if payment_refunds.refunds_in_progress(payment=payment) > 0:
        step_wait(
            step_id=step.id,
            attempt=attempt,
            seconds=0.01,
            note="waiting: a refund of the order is in progress",
        )
        return "waiting"
    at_most = payment.amount_captured - payment.amount_refunded
    failpoint(BUDGET_READ)
    done = sum((r.amount for r in succeeded), Decimal(0))
    if at_most <= 0:
        return _refund_done(step, refund_ids=[r.id for r in succeeded], amount=done)
    refund = payment_refunds.refund_request_capped(
        refund_id=refund_id,
        payment_id=payment.id,
        at_most=at_most,
        reason="cancellation",
        origin=RefundOrigin.CANCELLATION,
    )
    if refund is None:  # nothing refundable left now: done, with what was refunded so far
        return _refund_done(step, refund_ids=[r.id for r in succeeded], amount=done)
    step_wait(
        step_id=step.id, attempt=attempt, seconds=0.01, note=f"waiting for refund {refund.id}"
    )
    return "waiting"


def unchecked_cancellation_complete(step: CompensationStep, parent) -> bool:
    """WRONG (the completion before): `cancelling` → `cancelled` once every step is done,
    whatever the payment refunded."""
    return (
        order_transition(
            order=Order(id=step.order_id), source="cancelling", target="cancelled", kind="cancelled"
        )
        is not None
    )


@pytest.fixture
def unlocked_read(monkeypatch):
    monkeypatch.setitem(compensation_run._HANDLERS, StepName.REFUND, unlocked_refund)


@pytest.fixture
def unchecked_completion(monkeypatch):
    monkeypatch.setattr(
        compensation_state, "_cancellation_complete", unchecked_cancellation_complete
    )


# -- a goodwill refund asked while the step reads the budget -------------------------------


def test_a_goodwill_refund_asked_while_the_step_reads_waits_and_finds_nothing_left(
    cancelling, provider
):
    asked, waited = goodwill_while_the_step_reads(cancelling, "100.00")
    # The overlap: the goodwill refund waited for the payment's lock the step held; then the
    # step's request of everything had the budget, and the goodwill refund none.
    assert waited
    assert isinstance(asked, RefundExceedsCaptured), asked
    row = refund_step(cancelling)
    assert row.done_at is None and row.status == StepStatus.PENDING
    assert Refund.objects.get(id=cancellation_refund_id(cancelling.id)).amount == Decimal("100")
    assert decline_and_record_failed(provider) == []
    drive(order=cancelling, kind="cancellation")
    cancelling.refresh_from_db()
    assert cancelling.status == "cancelled"
    payment = payment_of(cancelling)
    assert payment.amount_refunded == payment.amount_captured == Decimal("100.00")
    assert [r["amount"] for r in provider_refunds(provider)] == ["100.00"]
    assert_reconciled()


def test_wrong_twin_an_unlocked_read_ends_cancelled_with_nothing_refunded(
    cancelling, provider, unlocked_read, unchecked_completion
):
    asked, waited = goodwill_while_the_step_reads(cancelling, "100.00")
    assert not waited and isinstance(asked, Refund)  # asked between the read and the request
    row = refund_step(cancelling)
    # The step is done although nothing is refunded: the goodwill refund held the budget.
    assert row.done_at is not None and row.detail["amount"] == "0.00"
    assert payment_of(cancelling).amount_refunded == Decimal(0)
    assert decline_and_record_failed(provider) == [asked]
    drive(order=cancelling, kind="cancellation")
    cancelling.refresh_from_db()
    payment = payment_of(cancelling)
    # A cancelled order whose payment refunded 0 of its 100.00: the finding.
    assert cancelling.status == "cancelled"
    assert payment.amount_refunded == Decimal(0) < payment.amount_captured
    assert provider_refunds(provider) == []


def test_the_completion_asks_again_for_what_a_refund_step_done_too_early_left(
    cancelling, provider, unlocked_read
):
    """The completion's own check: with the twin's read path the refund step is done with
    nothing refunded; the last step to finish finds refunded ≠ captured, does not write
    `cancelled`, reopens the refund step, and the order ends cancelled with all refunded."""
    asked, _ = goodwill_while_the_step_reads(cancelling, "100.00")
    assert isinstance(asked, Refund) and refund_step(cancelling).done_at is not None
    decline_and_record_failed(provider)
    drive(order=cancelling, kind="cancellation")
    cancelling.refresh_from_db()
    assert cancelling.status == "cancelled"
    payment = payment_of(cancelling)
    assert payment.amount_refunded == payment.amount_captured == Decimal("100.00")
    reopened = OrderEvent.objects.get(order=cancelling, kind="compensation_reopened")
    assert (reopened.from_status, reopened.to_status) == (StepStatus.DONE, StepStatus.PENDING)
    assert reopened.data["refunded"] == "0.00" and reopened.data["captured"] == "100.00"
    assert OrderEvent.objects.filter(order=cancelling, kind="cancelled", line=None).count() == 1
    assert_reconciled()


# -- a goodwill refund that holds the budget first -------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "cancellation_refunds"), [("declined", "100.00"), ("succeeded", "70.00")]
)
def test_a_goodwill_refund_holding_the_budget_first_makes_the_step_wait_then_it_refunds_the_rest(
    cancelling, provider, outcome, cancellation_refunds
):
    """A goodwill refund of 30.00 is being asked (its transaction holds the payment's lock) when
    the step reads: the step waits for the lock, then for the refund; declined and recorded
    failed, the cancellation refunds all 100.00; succeeded, the other 70.00."""
    asked, release = threading.Event(), threading.Event()

    def goodwill_held() -> Refund | ApplicationError:
        with transaction.atomic():
            refund = goodwill(cancelling, "30.00")
            asked.set()
            assert release.wait(TIMEOUT)
        return refund

    asks, steps = Workers(), Workers()
    asks.start(goodwill_held)
    assert asked.wait(TIMEOUT)
    row = refund_step(cancelling)
    CompensationStep.objects.filter(id=row.id).update(next_attempt_at=Now())
    steps.start(step_run, step_id=row.id)
    wait_for_lock_waiters(1, timeout=TIMEOUT)  # the step waits for the goodwill's lock
    release.set()
    (held,) = asks.join()
    assert steps.join() == ["waiting"]
    assert isinstance(held, Refund)
    assert not Refund.objects.filter(origin=RefundOrigin.CANCELLATION).exists()
    if outcome == "declined":
        assert decline_and_record_failed(provider) == [held]
    else:
        Refund.objects.filter(id=held.id).update(next_attempt_at=Now())
        assert refund_run(refund_id=held.id).status == RefundStatus.SUCCEEDED
    drive(order=cancelling, kind="cancellation")
    cancelling.refresh_from_db()
    assert cancelling.status == "cancelled"
    payment = payment_of(cancelling)
    assert payment.amount_refunded == payment.amount_captured == Decimal("100.00")
    mine = Refund.objects.get(id=cancellation_refund_id(cancelling.id))
    assert mine.amount == Decimal(cancellation_refunds) and mine.status == RefundStatus.SUCCEEDED
    assert_reconciled()
