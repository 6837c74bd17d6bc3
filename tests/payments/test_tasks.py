"""The Celery tasks are thin: the sweeper leases due rows, the settle task runs one attempt."""

from decimal import Decimal

import pytest
from django.db.models.functions import Now

from payments.models import PaymentSettlement, PaymentStatus
from payments.services import payment_capture, payment_create
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
    PaymentSettlement.objects.filter(id=settlement.id).update(next_attempt_at=Now())

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
    assert entry["schedule"] <= settings.CELERY_MAX_COUNTDOWN
