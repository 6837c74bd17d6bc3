"""The issue's done-when scenarios: real simulator process, real shop processes, real faults.

Every scenario ends with the independent reconciliation (`reconcile_payments`).
"""

import json
import threading
from decimal import Decimal

import pytest
from django.db import connection
from django.db.models.functions import Now

from payments.capture import payment_capture, payment_create
from payments.models import PaymentSettlement, PaymentStatus
from payments.settlement import payment_settle

from .conftest import assert_reconciled, run_settle_process, settle_due, start_capture_process

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def make_payment(method, reference="order-1", amount="42.00"):
    return payment_create(
        reference=reference, amount=Decimal(amount), currency="EUR", payment_method=method
    )


def capture_key(payment) -> str:
    return payment.transactions.get(kind="capture").provider_key


def test_timeout_one_charge_captured_after_settlement(provider, settled_calls):
    payment = make_payment("pm_card_timeout")
    result = payment_capture(payment_id=payment.id)
    assert result.outcome == "unknown"
    assert "ReadTimeout" in result.detail
    key = capture_key(payment)
    assert len(provider.charges(key)) == 1  # the provider did charge
    assert result.payment.status == PaymentStatus.PENDING

    settle_due(payment)
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.CAPTURED
    assert payment.amount_captured == Decimal("42.00")
    assert len(provider.charges(key)) == 1
    assert [(c["outcome"], c["in_transaction"], c["status_in_db"]) for c in settled_calls] == [
        ("succeeded", True, "captured")
    ]
    assert_reconciled()


def test_unavailable_first_attempt_unknown_settlement_completes_it(provider, settled_calls):
    payment = make_payment("pm_card_unavailable")
    assert payment_capture(payment_id=payment.id).outcome == "unknown"
    key = capture_key(payment)
    assert provider.charges(key) == []

    first = settle_due(payment)  # looks up (not found), re-sends: the second 503
    payment.refresh_from_db()
    assert (first.attempts, payment.status) == (1, PaymentStatus.PENDING)
    second = settle_due(payment)  # the third call under the key goes through
    payment.refresh_from_db()
    assert (second.attempts, payment.status) == (2, PaymentStatus.CAPTURED)
    assert second.settled_at is not None
    assert len(provider.charges(key)) == 1
    assert provider.state()["stats"]["unavailable"] == 2
    assert [c["outcome"] for c in settled_calls] == ["succeeded"]
    assert_reconciled()


@pytest.mark.parametrize("point", ["before_apply", "after_apply"])
def test_simulator_killed_between_receiving_and_answering(provider, settings, point):
    """Killed before or after it applied the charge: settlement finds which, charges once."""
    settings.PAYMENTS_PROVIDER_TIMEOUT = 15.0  # the client sees the kill, not a timeout
    payment = make_payment("pm_card_ok")
    provider.faults(pause=point)
    results = {}

    def capture():
        try:
            results["capture"] = payment_capture(payment_id=payment.id)
        finally:
            connection.close()

    caller = threading.Thread(target=capture)
    caller.start()
    provider.wait_for(lambda s: s["paused"] == 1)  # received, not answered
    provider.kill()
    caller.join(20)
    assert results["capture"].outcome == "unknown"
    assert "ConnectionError" in results["capture"].detail

    provider.start()  # same port, same ledger file; faults are gone with the process
    key = capture_key(payment)
    assert len(provider.charges(key)) == (1 if point == "after_apply" else 0)
    settle_due(payment)
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.CAPTURED
    assert len(provider.charges(key)) == 1
    assert_reconciled()


def test_same_capture_from_two_processes_at_once_charges_once(provider):
    payment = make_payment("pm_card_ok")
    # Hold the first call that arrives inside the provider, so the other one
    # provably arrives while it is in progress.
    provider.faults(pause="before_apply")
    procs = [start_capture_process(provider, payment.id, wait=True) for _ in range(2)]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    for proc in procs:  # the barrier opens for both at once
        proc.stdin.write("go\n")
        proc.stdin.flush()
    state = provider.wait_for(lambda s: s["paused"] == 1 and s["stats"].get("in_use_conflicts"))
    assert state["stats"]["in_use_conflicts"] == 1  # the overlap really happened
    provider.release()
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(o["outcome"] for o in outputs) in (
        ["succeeded", "unknown"],  # the loser met 409 in_use before the winner recorded
        ["succeeded", "succeeded"],  # the loser re-read after the winner recorded
    )
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.CAPTURED
    assert payment.amount_captured == Decimal("42.00")
    assert payment.transactions.count() == 1
    assert len(provider.charges(capture_key(payment))) == 1
    assert_reconciled()


def test_shop_killed_after_provider_answered_settlement_records_once(
    provider, settled_calls, tmp_path
):
    payment = make_payment("pm_card_ok")
    proc = start_capture_process(
        provider,
        payment.id,
        SHOP_FAILPOINTS="payments.capture.after_provider=exit@1",
        SHOP_FAILPOINTS_DIR=str(tmp_path / "failpoints"),
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, (out, err)  # died by the failpoint, printed nothing
    assert out == ""

    key = capture_key(payment)
    payment.refresh_from_db()
    assert len(provider.charges(key)) == 1  # the provider charged and answered
    assert payment.status == PaymentStatus.PENDING  # the shop never recorded it
    settlement = PaymentSettlement.objects.get(transaction__payment=payment)
    assert settlement.settled_at is None  # the row written before the call is there

    settle_due(payment)
    settle_due(payment)  # a second runner (redelivery, sweeper) changes nothing
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.CAPTURED
    assert payment.amount_captured == Decimal("42.00")
    assert payment.events.filter(to_status=PaymentStatus.CAPTURED).count() == 1
    assert [c["outcome"] for c in settled_calls] == ["succeeded"]
    assert len(provider.charges(key)) == 1
    # The same failpoint counted across processes: a second shop process is not killed.
    again = start_capture_process(
        provider,
        payment.id,
        SHOP_FAILPOINTS="payments.capture.after_provider=exit@1",
        SHOP_FAILPOINTS_DIR=str(tmp_path / "failpoints"),
    )
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert json.loads(out)["outcome"] == "succeeded"
    assert len(provider.charges(key)) == 1
    assert_reconciled()


def test_settlement_worker_killed_after_the_lookup_answered(provider, settled_calls, tmp_path):
    payment = make_payment("pm_card_timeout")
    assert payment_capture(payment_id=payment.id).outcome == "unknown"
    settlement = PaymentSettlement.objects.get(transaction__payment=payment)
    PaymentSettlement.objects.filter(id=settlement.id).update(next_attempt_at=Now())
    killed = run_settle_process(
        provider,
        settlement.id,
        SHOP_FAILPOINTS="payments.settle.after_lookup=exit@1",
        SHOP_FAILPOINTS_DIR=str(tmp_path / "failpoints"),
    )
    assert killed.returncode == 1, killed.stderr
    assert provider.state()["stats"]["lookups"] == 1  # the provider answered the look-up
    settlement.refresh_from_db()
    payment.refresh_from_db()
    assert (settlement.attempts, settlement.settled_at) == (1, None)  # counted, not recorded
    assert payment.status == PaymentStatus.PENDING
    # Its backoff over, still no second attempt while the killed one's attempt lease runs.
    PaymentSettlement.objects.filter(id=settlement.id).update(next_attempt_at=Now())
    assert payment_settle(settlement_id=settlement.id).attempts == 1
    PaymentSettlement.objects.filter(id=settlement.id).update(lease_expires_at=Now())

    settle_due(payment)
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.CAPTURED
    assert [c["outcome"] for c in settled_calls] == ["succeeded"]
    assert len(provider.charges(capture_key(payment))) == 1
    assert_reconciled()


def test_shop_killed_before_calling_the_provider_settlement_sends_it(
    provider, settled_calls, tmp_path
):
    payment = make_payment("pm_card_ok")
    proc = start_capture_process(
        provider, payment.id, SHOP_FAILPOINTS="payments.capture.before_provider=exit"
    )
    proc.communicate(timeout=60)
    assert proc.returncode == 1
    key = capture_key(payment)
    assert provider.charges(key) == []
    settle_due(payment)  # not found at the provider: sent again under the same key
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.CAPTURED
    assert len(provider.charges(key)) == 1
    assert [c["outcome"] for c in settled_calls] == ["succeeded"]
    assert_reconciled()


def test_slow_original_and_settlement_resend_race_to_one_charge(provider, settings):
    """The first call is still on its way when settlement re-sends under the same key."""
    payment = make_payment("pm_card_ok")
    provider.faults(latency_ms=3000)
    assert payment_capture(payment_id=payment.id).outcome == "unknown"  # 1 s client timeout
    provider.faults(latency_ms=0)
    settle_due(payment)  # not found yet: re-sent under the same key, applied
    assert provider.state()["delayed"] == 1  # the overlap: the original is still on its way
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.CAPTURED
    state = provider.wait_for(lambda s: s["delayed"] == 0 and not s["in_flight"])
    assert state["stats"]["replays"] == 1  # the original arrived and was answered from the ledger
    assert len(provider.charges(capture_key(payment))) == 1
    assert_reconciled()
