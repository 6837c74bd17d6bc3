"""Refunds: reserved in the database before any provider call, recorded by one transition.

Against the real simulator process and PostgreSQL; the task body
(`refund_run`) runs in this process here (the real worker is in
test_refunds_worker.py).
"""

from __future__ import annotations

import threading
import uuid
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models.functions import Now

from core.errors import InvalidState
from idempotency.models import InboxMessage
from payments import webhooks
from payments.capture import payment_create
from payments.errors import RefundExceedsCaptured, RefundInvalidState
from payments.gateway import get_gateway
from payments.models import (
    Payment,
    PaymentEvent,
    PaymentStatus,
    PaymentTransaction,
    Refund,
    RefundStatus,
    TransactionKind,
)
from payments.refund_decisions import refund_record_failed, refund_record_outside
from payments.refunds import refund_provider_key, refund_request, refund_run
from payments.tasks import sweep_refunds
from tests.concurrency import Workers
from tests.payments.refund_support import captured, provider_refunds, refund_event
from tests.support.simulator import assert_reconciled

pytestmark = pytest.mark.django_db(transaction=True)


def ask(payment, amount: str, refund_id=None, **kwargs) -> Refund:
    return refund_request(
        refund_id=refund_id or uuid.uuid4(),
        payment_id=payment.id,
        amount=Decimal(amount),
        reason=kwargs.pop("reason", "goodwill"),
        origin=kwargs.pop("origin", "goodwill"),
        **kwargs,
    )


def test_refunds_reserve_then_succeed_and_move_the_payment(provider):
    payment = captured(amount="20.00")
    first = ask(payment, "5.00")
    assert first.status == RefundStatus.PENDING
    assert first.provider_key.endswith(f":refund-{first.id}:refund")
    payment.refresh_from_db()
    assert (payment.refund_reserved, payment.amount_refunded) == (Decimal("5.00"), 0)
    assert provider_refunds(provider) == []  # nothing sent in the request's transaction

    assert refund_run(refund_id=first.id).status == RefundStatus.SUCCEEDED
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.PARTIALLY_REFUNDED
    assert payment.amount_refunded == Decimal("5.00")
    txn = PaymentTransaction.objects.get(
        kind=TransactionKind.REFUND, provider_key=first.provider_key
    )
    assert txn.status == "succeeded" and txn.amount == Decimal("5.00")
    assert PaymentEvent.objects.filter(
        payment=payment, kind="transition", to_status="partially_refunded"
    ).exists()

    rest = ask(payment, "15.00")
    refund_run(refund_id=rest.id)
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.REFUNDED
    assert payment.amount_refunded == payment.refund_reserved == Decimal("20.00")
    assert len(provider_refunds(provider)) == 2
    assert refund_run(refund_id=rest.id).status == RefundStatus.SUCCEEDED  # not due: no-op
    assert len(provider_refunds(provider)) == 2
    assert_reconciled()


def test_same_refund_id_five_times_is_one_refund(provider):
    payment = captured(amount="20.00")
    refund_id = uuid.uuid4()
    rows = [ask(payment, "6.00", refund_id=refund_id) for _ in range(5)]
    assert {r.id for r in rows} == {refund_id}
    assert Refund.objects.count() == 1
    # Every retry derives the same provider key: one provider call row, no orphan.
    refund_txns = PaymentTransaction.objects.filter(payment=payment, kind="refund")
    assert list(refund_txns.values_list("provider_key", flat=True)) == [rows[0].provider_key]
    assert Payment.objects.get(id=payment.id).refund_reserved == Decimal("6.00")
    for _ in range(5):
        refund_run(refund_id=refund_id)
    assert len(provider_refunds(provider)) == 1
    assert Payment.objects.get(id=payment.id).amount_refunded == Decimal("6.00")
    assert_reconciled()


def test_refusals_reserve_nothing(provider):
    payment = captured(amount="10.00")
    ask(payment, "7.00")
    with pytest.raises(RefundExceedsCaptured) as refused:
        ask(payment, "3.01")
    assert refused.value.extra["refundable"] == "3.00"
    assert Refund.objects.count() == 1
    assert Payment.objects.get(id=payment.id).refund_reserved == Decimal("7.00")

    unpaid = payment_create(
        reference="order-unpaid", amount=Decimal("5"), currency="EUR", payment_method="pm_card_ok"
    )
    with pytest.raises(InvalidState) as refused_state:
        ask(unpaid, "1.00")
    assert isinstance(refused_state.value, RefundInvalidState)
    assert Refund.objects.filter(payment=unpaid).count() == 0


def test_a_refund_in_the_wrong_state_is_the_one_invalid_state_refusal():
    # One class answers `invalid_state`: the refund's refusal is that class, so
    # its answer cannot drift from the order's or the return's.
    assert issubclass(RefundInvalidState, InvalidState)
    assert vars(RefundInvalidState).keys().isdisjoint({"status", "code", "title"})


def test_the_database_refuses_reserving_more_than_captured(provider):
    payment = captured(amount="10.00")
    with pytest.raises(IntegrityError), transaction.atomic():
        Payment.objects.filter(id=payment.id).update(refund_reserved=Decimal("10.01"))
    with pytest.raises(IntegrityError), transaction.atomic():
        Payment.objects.filter(id=payment.id).update(amount_refunded=Decimal("1.00"))


def _reserve_wrong(payment_id, amount: Decimal, barrier: threading.Barrier) -> bool:
    """The deliberately wrong twin: read the reserved total, check, write it back."""
    try:
        with transaction.atomic():
            payment = Payment.objects.get(id=payment_id)
            fits = payment.refund_reserved + amount <= payment.amount_captured
            barrier.wait(timeout=30)  # every twin has read the same total
            if fits:
                Payment.objects.filter(id=payment_id).update(
                    refund_reserved=payment.refund_reserved + amount
                )
            return fits
    finally:
        connection.close()


def test_concurrent_refunds_never_exceed_captured_and_the_wrong_twin_does(provider):
    payment = captured(amount="20.00")
    amounts = [Decimal("3.00")] * 12  # 36.00 asked of 20.00 captured
    barrier = threading.Barrier(len(amounts))

    def contender(amount):
        barrier.wait(timeout=30)
        try:
            return ask(payment, str(amount)).amount
        except RefundExceedsCaptured:
            return None
        finally:
            connection.close()

    workers = Workers()
    for amount in amounts:
        workers.start(contender, amount)
    results = workers.join()
    granted = [r for r in results if r is not None]
    assert sum(granted) == Decimal("18.00")  # six fit, six were refused
    assert Payment.objects.get(id=payment.id).refund_reserved == Decimal("18.00")
    for refund in Refund.objects.all():
        refund_run(refund_id=refund.id)
    assert sum(Decimal(op["amount"]) for op in provider_refunds(provider)) == Decimal("18.00")
    assert_reconciled()

    # The twin holds a connection across its barrier: fewer threads than the pool.
    other = captured(amount="20.00")
    twin_amounts = [Decimal("4.00")] * 6  # 24.00 asked of 20.00 captured
    wrong = Workers()
    twin_barrier = threading.Barrier(len(twin_amounts))
    for amount in twin_amounts:
        wrong.start(_reserve_wrong, other.id, amount, twin_barrier)
    approved = sum(a for a, ok in zip(twin_amounts, wrong.join(), strict=True) if ok)
    assert approved > other.amount_captured  # every twin "fits": 24.00 promised of 20.00


def test_lost_answer_is_settled_by_lookup(provider):
    # The refund inherits pm_card_timeout from the capture: applied, answer lost.
    payment = captured(amount="9.00", method="pm_card_timeout")
    refund = ask(payment, "4.00")
    assert refund_run(refund_id=refund.id).status == RefundStatus.SUCCEEDED
    assert provider.state()["stats"].get("answers_lost", 0) >= 2  # capture and refund
    assert len(provider_refunds(provider)) == 1
    assert Payment.objects.get(id=payment.id).amount_refunded == Decimal("4.00")
    assert_reconciled()


def test_unknown_stays_pending_with_backoff_and_sweeper_finishes(provider, monkeypatch):
    payment = captured(amount="9.00")
    refund = ask(payment, "4.00")
    provider.faults(refuse_connections=True)
    assert refund_run(refund_id=refund.id).status == RefundStatus.PENDING
    row = Refund.objects.get(id=refund.id)
    assert row.attempts == 1 and row.last_error and row.done_at is None
    provider.faults(refuse_connections=False)
    Refund.objects.filter(id=refund.id).update(next_attempt_at=Now())  # its backoff has passed
    rung = []
    monkeypatch.setattr("payments.tasks.refund.delay", lambda pk: rung.append(pk))
    assert sweep_refunds.apply().get() == 1
    assert rung == [str(refund.id)]
    assert refund_run(refund_id=refund.id).status == RefundStatus.SUCCEEDED
    assert len(provider_refunds(provider)) == 1
    assert_reconciled()


def test_permanent_refusal_needs_attention_then_staff_record_outside_once(provider):
    payment = captured(amount="10.00")
    provider.faults(decline_refunds=True)
    refund = ask(payment, "4.00")
    assert refund_run(refund_id=refund.id).status == RefundStatus.NEEDS_ATTENTION
    payment.refresh_from_db()
    assert payment.refund_reserved == Decimal("4.00")  # kept until staff decide
    assert payment.amount_refunded == 0
    assert PaymentEvent.objects.filter(payment=payment, kind="needs_attention").count() == 1

    assert refund_record_outside(refund_id=refund.id) is True
    assert refund_record_outside(refund_id=refund.id) is False  # a second click: nothing
    assert refund_record_failed(refund_id=refund.id) is False
    payment.refresh_from_db()
    assert payment.amount_refunded == Decimal("4.00")
    assert payment.status == PaymentStatus.PARTIALLY_REFUNDED
    assert Refund.objects.get(id=refund.id).outside_shop
    assert_reconciled()  # the provider declined; staff gave the money back elsewhere


def test_staff_failed_outcome_releases_the_reservation(provider):
    payment = captured(amount="10.00")
    provider.faults(decline_refunds=True)
    refund = ask(payment, "10.00")
    refund_run(refund_id=refund.id)
    assert refund_record_failed(refund_id=refund.id) is True
    assert refund_record_failed(refund_id=refund.id) is False
    payment.refresh_from_db()
    assert (payment.refund_reserved, payment.amount_refunded) == (0, 0)
    assert Refund.objects.get(id=refund.id).status == RefundStatus.FAILED
    provider.faults(decline_refunds=False)
    again = ask(payment, "10.00")  # refundable again, under a new refund id
    assert refund_run(refund_id=again.id).status == RefundStatus.SUCCEEDED
    assert_reconciled()


# -- webhooks ------------------------------------------------------------------------


def _send_at_provider(payment, refund_id, amount: str) -> str:
    """The provider refunds under the shop's key (as the task's call whose answer was lost)."""
    key = refund_provider_key(refund_id=refund_id)
    capture_key = PaymentTransaction.objects.get(payment=payment, kind="capture").provider_key
    result = get_gateway().refund(
        key=key,
        capture_key=capture_key,
        amount=Decimal(amount),
        currency="EUR",
        reference=payment.reference,
    )
    assert result.outcome == "succeeded"
    return key


def test_refund_webhook_duplicate_and_before_the_task_is_one_effect(provider):
    payment = captured(amount="10.00")
    refund = ask(payment, "4.00")
    key = _send_at_provider(payment, refund.id, "4.00")
    body, header = refund_event(key=key, amount="4.00", event_id="evt_r1")
    assert webhooks.webhook_receive(body=body, signature=header).status == webhooks.APPLIED
    assert webhooks.webhook_receive(body=body, signature=header).status == webhooks.DUPLICATE
    other, header2 = refund_event(key=key, amount="4.00", event_id="evt_r2")
    assert webhooks.webhook_receive(body=other, signature=header2).status == webhooks.NO_EFFECT
    assert refund_run(refund_id=refund.id).status == RefundStatus.SUCCEEDED  # not due any more
    payment.refresh_from_db()
    assert payment.amount_refunded == Decimal("4.00")
    assert PaymentEvent.objects.filter(payment=payment, to_status="partially_refunded").count() == 1
    assert len(provider_refunds(provider)) == 1
    assert_reconciled()


def test_refund_event_stored_unmatched_is_applied_when_the_task_meets_it(provider):
    payment = captured(amount="10.00")
    refund_id = uuid.uuid4()
    key = _send_at_provider(payment, refund_id, "2.50")
    body, header = refund_event(key=key, amount="2.50")
    assert webhooks.webhook_receive(body=body, signature=header).status == webhooks.UNMATCHED

    refund = ask(payment, "2.50", refund_id=refund_id)
    provider.faults(refuse_connections=True)  # the task hears nothing from the provider
    assert refund_run(refund_id=refund.id).status == RefundStatus.SUCCEEDED
    provider.faults(refuse_connections=False)
    assert InboxMessage.objects.get(message_type="refund.succeeded").status == webhooks.APPLIED
    assert Payment.objects.get(id=payment.id).amount_refunded == Decimal("2.50")
    assert len(provider_refunds(provider)) == 1
    assert_reconciled()


def test_refund_failed_webhook_flags_it(provider):
    payment = captured(amount="10.00")
    refund = ask(payment, "1.00")
    body, header = refund_event(key=refund.provider_key, amount="1.00", kind="refund.failed")
    assert webhooks.webhook_receive(body=body, signature=header).status == webhooks.APPLIED
    assert Refund.objects.get(id=refund.id).status == RefundStatus.NEEDS_ATTENTION


# -- the provider's late word after a staff decision (issue 20, finding 5) ----------------------


def _late_success(refund) -> webhooks.WebhookOutcome:
    payment = Payment.objects.get(id=refund.payment_id)
    key = _send_at_provider(payment, refund.id, str(refund.amount))
    body, header = refund_event(key=key, amount=str(refund.amount))
    return webhooks.webhook_receive(body=body, signature=header)


def _flagged(payment, amount: str) -> Refund:
    """A refund whose outcome stayed unknown: it needs attention (staff decide)."""
    from payments.recording import refund_flag

    refund = ask(payment, amount)
    assert refund_flag(refund_id=refund.id, reason="refund outcome still unknown")
    return refund


def _differences(kind: str) -> list:
    from payments.reconciliation import reconcile_payments

    return [d for d in reconcile_payments().differences if d.kind == kind]


def test_a_late_provider_refund_after_outside_the_shop_needs_attention_until_accepted(provider):
    payment = captured(amount="10.00")
    refund = _flagged(payment, "4.00")
    assert refund_record_outside(refund_id=refund.id)
    outcome = _late_success(refund)
    assert outcome.status == webhooks.SUSPICIOUS
    row = Refund.objects.get(id=refund.id)
    assert row.needs_attention and row.status == RefundStatus.SUCCEEDED
    assert row.last_error.startswith(
        "the provider reports a refund that was recorded as outside the shop"
    )
    assert PaymentEvent.objects.filter(payment=payment, kind="late_provider_refund").count() == 1
    from payments.reconciliation import REFUND_AFTER_DECISION
    from payments.refund_decisions import refund_accept_provider

    assert _differences(REFUND_AFTER_DECISION)
    # Its way out: staff accept the provider's refund (the outside payment recovered).
    assert refund_accept_provider(refund_id=refund.id) is True
    assert refund_accept_provider(refund_id=refund.id) is False  # a second click: nothing
    row = Refund.objects.get(id=refund.id)
    assert not row.needs_attention and not row.outside_shop
    payment.refresh_from_db()
    assert payment.amount_refunded == payment.refund_reserved == Decimal("4.00")
    assert_reconciled()


def test_a_late_provider_refund_after_record_failed_holds_the_budget_until_accepted(provider):
    payment = captured(amount="10.00")
    refund = _flagged(payment, "4.00")
    assert refund_record_failed(refund_id=refund.id)
    assert _late_success(refund).status == webhooks.SUSPICIOUS
    row = Refund.objects.get(id=refund.id)
    assert row.needs_attention and row.status == RefundStatus.FAILED
    assert row.last_error.startswith("the provider reports a refund that was recorded as failed")
    assert PaymentEvent.objects.filter(payment=payment, kind="late_provider_refund").count() == 1
    from payments.reconciliation import REFUND_AFTER_DECISION
    from payments.refund_decisions import refund_accept_provider

    assert _differences(REFUND_AFTER_DECISION)
    # No second hole in the budget: the provider's 4.00 is held again at once.
    payment.refresh_from_db()
    assert payment.refund_reserved == Decimal("4.00")
    with pytest.raises(RefundExceedsCaptured):
        ask(payment, "6.01")
    assert refund_accept_provider(refund_id=refund.id) is True
    assert refund_accept_provider(refund_id=refund.id) is False
    row = Refund.objects.get(id=refund.id)
    assert row.status == RefundStatus.SUCCEEDED and not row.needs_attention
    payment.refresh_from_db()
    assert payment.amount_refunded == payment.refund_reserved == Decimal("4.00")
    assert payment.status == PaymentStatus.PARTIALLY_REFUNDED
    assert_reconciled()
