"""Refunds through a real Celery worker: killed mid-call, or exiting after the provider refunded.

Either way the row is the ledger: the attempt pushed `next_attempt_at` back
before calling out, so the retried task or beat's sweeper makes the next
attempt, which looks the key up and records the refund once.
"""

from __future__ import annotations

import os
import signal
import uuid
from decimal import Decimal

import pytest

from payments.models import Payment, Refund, RefundStatus
from payments.refunds import refund_request
from payments.tasks import sweep_refunds
from tests.payments.refund_support import captured, provider_refunds
from tests.support.servers import wait_until
from tests.support.simulator import assert_reconciled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORKER_ENV = {"PAYMENTS_PROVIDER_TIMEOUT": "2", "PAYMENTS_REFUND_BACKOFF_BASE": "0.5"}


def _ask(payment, amount: str) -> Refund:
    return refund_request(
        refund_id=uuid.uuid4(),
        payment_id=payment.id,
        amount=Decimal(amount),
        reason="goodwill",
        origin="goodwill",
    )


def _recorded_by_retry_or_sweep(refund: Refund) -> Refund:
    """Play beat: sweep until the refund is recorded (the worker runs what is rung)."""

    def done():
        row = Refund.objects.get(id=refund.id)
        if row.status == RefundStatus.PENDING:
            sweep_refunds.apply()
            return None
        return row

    return wait_until(done, timeout=60, interval=0.5, message="the refund is recorded")


def _assert_once(provider, payment, amount: str) -> None:
    assert len(provider_refunds(provider)) == 1
    payment.refresh_from_db()
    assert payment.amount_refunded == payment.refund_reserved == Decimal(amount)
    assert payment.events.filter(kind="transition", to_status="partially_refunded").count() == 1
    assert_reconciled()


def test_exit_after_the_provider_refunded_is_recorded_once(provider, celery_worker_process):
    payment = captured(amount="12.00")
    worker = celery_worker_process(
        failpoints="payments.refund.after_provider=exit@1",
        PAYMENTS_PROVIDER_URL=provider.url,
        **WORKER_ENV,
    )
    refund = _ask(payment, "5.00")  # rung after commit: the worker takes it
    wait_until(lambda: len(provider_refunds(provider)) == 1, timeout=60, message="refunded")
    wait_until(
        lambda: (
            "exited" in worker.log()
            or "WorkerLostError" in worker.log()
            or "signal" in worker.log()
        ),
        timeout=30,
        message="the worker's child died at the failpoint",
    )
    assert Refund.objects.get(id=refund.id).status == RefundStatus.PENDING  # shop knows nothing
    row = _recorded_by_retry_or_sweep(refund)
    assert row.status == RefundStatus.SUCCEEDED and row.attempts >= 2
    _assert_once(provider, payment, "5.00")


def test_worker_sigkilled_during_the_call_is_recorded_once(provider, celery_worker_process):
    payment = captured(amount="12.00")
    provider.faults(pause="after_apply")  # applied at the provider, the answer held back
    worker = celery_worker_process(PAYMENTS_PROVIDER_URL=provider.url, **WORKER_ENV)
    refund = _ask(payment, "5.00")
    provider.wait_for(lambda state: state["paused"] == 1, timeout=60)
    os.killpg(worker.process.pid, signal.SIGKILL)  # the whole worker, mid-call
    worker.process.wait(timeout=10)
    provider.release()
    assert len(provider_refunds(provider)) == 1
    assert Refund.objects.get(id=refund.id).status == RefundStatus.PENDING

    celery_worker_process(PAYMENTS_PROVIDER_URL=provider.url, **WORKER_ENV)
    row = _recorded_by_retry_or_sweep(refund)
    assert row.status == RefundStatus.SUCCEEDED
    _assert_once(provider, payment, "5.00")
    assert Payment.objects.get(id=payment.id).status == "partially_refunded"
