"""The broker is a doorbell, the database is the ledger.

A Redis that loses its queued messages (restart without persistence,
FLUSHDB) must lose no work: the settlement row is still due, and the beat
sweeper rings again for a real worker process.
"""

from decimal import Decimal

import pytest
import redis
from django.conf import settings as django_settings
from django.db.models.functions import Now

from payments.capture import payment_capture, payment_create
from payments.models import Payment, PaymentSettlement, PaymentStatus
from payments.tasks import sweep_settlements
from tests.payments.conftest import assert_reconciled
from tests.support.broker import queued
from tests.support.servers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_lost_queue_loses_no_settlement(provider, celery_worker_process):
    broker = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    payment = payment_create(
        reference="order-broker-loss",
        amount=Decimal("7.00"),
        currency="EUR",
        payment_method="pm_card_timeout",
    )
    # The capture is applied at the provider, the answer is lost; its
    # on-commit bell puts a settle message on the queue.
    assert payment_capture(payment_id=payment.id).outcome == "unknown"
    assert queued(broker) >= 1

    broker.flushdb()  # the broker forgets every queued message
    assert queued(broker) == 0

    celery_worker_process(PAYMENTS_PROVIDER_URL=provider.url, PAYMENTS_PROVIDER_TIMEOUT="2")
    settlement = PaymentSettlement.objects.get(transaction__payment=payment)
    # Time passes: the row is due, and the lost ring's lease (PAYMENTS_SETTLE_LEASE) has
    # run out, so the sweeper may ring it again.
    PaymentSettlement.objects.filter(id=settlement.id).update(
        next_attempt_at=Now(), lease_expires_at=Now()
    )
    # Nothing rings while the queue is empty: the payment waits.
    assert Payment.objects.get(id=payment.id).status == PaymentStatus.PENDING

    # Beat's sweeper finds the due row in the database and rings again.
    assert sweep_settlements.apply().get() == 1
    wait_until(
        lambda: Payment.objects.get(id=payment.id).status == PaymentStatus.CAPTURED,
        timeout=60,
        message="the worker settles the payment after the sweep",
    )
    assert len(provider.ledger()) == 1  # one charge, never a second
    assert_reconciled()
