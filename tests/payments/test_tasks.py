"""The Celery tasks are thin: the sweeper leases due rows, the settle task runs one attempt."""

from decimal import Decimal

import pytest
from django.db.models.functions import Now

from payments.capture import payment_capture, payment_create
from payments.models import PaymentSettlement, PaymentStatus
from payments.tasks import settle_payment, sweep_settlements

pytestmark = pytest.mark.django_db(transaction=True)


def test_sweeper_enqueues_due_rows_once_and_settle_task_records(provider, settings, monkeypatch):
    payment = payment_create(
        reference="order-1",
        amount=Decimal("8.00"),
        currency="EUR",
        payment_method="pm_card_timeout",
    )
    assert payment_capture(payment_id=payment.id).outcome == "unknown"
    settlement = PaymentSettlement.objects.get(transaction__payment=payment)
    # Due now, and the ring for later that capture sent (its lease) lost.
    PaymentSettlement.objects.filter(id=settlement.id).update(
        next_attempt_at=Now(), lease_owner="", lease_expires_at=None
    )

    enqueued = []
    monkeypatch.setattr(settle_payment, "delay", lambda sid: enqueued.append(sid))
    assert sweep_settlements.apply().get() == 1
    assert sweep_settlements.apply().get() == 0  # leased: not enqueued twice
    assert enqueued == [settlement.id]

    settle_payment.apply(args=[settlement.id]).get()
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.CAPTURED


def test_sweep_is_on_the_beat_schedule(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["payments.sweep_settlements"]
    assert entry["task"] == sweep_settlements.name
    # A tick not run within one interval is dropped (countdowns and time limits
    # against the visibility timeout: tests/config/test_celery.py).
    assert 0 < entry["options"]["expires"] <= entry["schedule"]


def test_settled_handler_that_keeps_raising_ends_in_needs_attention(provider, settings):
    """A recorder that always fails must not loop forever: the attempt budget flags it."""
    settings.PAYMENTS_SETTLE_MAX_ATTEMPTS = 2
    settings.PAYMENTS_SETTLED_HANDLER = "tests.payments.test_tasks.raising_handler"
    payment = payment_create(
        reference="order-raise",
        amount=Decimal("3.00"),
        currency="EUR",
        payment_method="pm_card_timeout",
    )
    assert payment_capture(payment_id=payment.id).outcome == "unknown"
    settlement = PaymentSettlement.objects.get(transaction__payment=payment)
    # An attempt the recorder's exception escaped keeps its attempt lease (as a killed one
    # would): the row is due again when the lease runs out, played here.
    for _ in range(2):
        PaymentSettlement.objects.filter(id=settlement.id).update(
            next_attempt_at=Now(), lease_expires_at=Now()
        )
        with pytest.raises(RuntimeError, match="handler broke"):
            settle_payment.apply(args=[settlement.id]).get()
    PaymentSettlement.objects.filter(id=settlement.id).update(
        next_attempt_at=Now(), lease_expires_at=Now()
    )
    settle_payment.apply(args=[settlement.id]).get()
    settlement.refresh_from_db()
    assert settlement.needs_attention
    assert settlement.settled_at is None
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.PENDING


def raising_handler(*, payment, outcome):
    raise RuntimeError("handler broke")
