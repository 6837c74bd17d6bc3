"""Reconciliation reads the provider's ledger and reports every difference."""

import subprocess
import sys
from decimal import Decimal

import pytest
from django.db.models import F

from payments.capture import payment_capture, payment_create
from payments.gateway import get_gateway
from payments.keys import install_id, provider_key
from payments.models import Payment, PaymentTransaction

from .conftest import ROOT, reconcile, shop_env

pytestmark = pytest.mark.django_db(transaction=True)


def captured_payment(reference="order-1", amount="10.00", method="pm_card_ok"):
    payment = payment_create(
        reference=reference, amount=Decimal(amount), currency="EUR", payment_method=method
    )
    payment_capture(payment_id=payment.id)
    payment.refresh_from_db()
    return payment


def kinds(report) -> list[tuple[str, str]]:
    return [(d["kind"], d["key"]) for d in report["differences"]]


def test_clean_when_both_sides_agree(provider):
    captured_payment("order-1")
    captured_payment("order-2", method="pm_card_declined")
    report = reconcile()
    assert report["clean"], report
    assert report["provider_operations"] == 2 and report["shop_transactions"] == 2


def test_clean_with_nothing_ever_sent(provider):
    assert reconcile()["clean"]


def test_money_the_provider_moved_but_the_shop_does_not_know(provider):
    captured_payment("order-1")
    stray = provider_key(install=install_id(), reference="order-99", kind="capture")
    get_gateway().capture(
        key=stray,
        amount=Decimal("5.00"),
        currency="EUR",
        reference="order-99",
        payment_method="pm_card_ok",
    )
    report = reconcile()
    assert not report["clean"]
    assert kinds(report) == [("extra_at_provider", stray), ("different_total", "order-99")]


def test_other_installations_are_not_ours(provider):
    captured_payment("order-1")
    get_gateway().capture(
        key="someone-else:order-1:capture",
        amount=Decimal("5.00"),
        currency="EUR",
        reference="order-1",
        payment_method="pm_card_ok",
    )
    assert reconcile()["clean"]


def test_shop_booked_money_the_provider_never_moved(provider):
    payment = captured_payment("order-1")
    ghost = PaymentTransaction.objects.create(
        payment=payment,
        kind="capture",
        provider_key=f"{install_id()}:order-1:capture-2",
        amount=Decimal("1.00"),
        currency="EUR",
        status="succeeded",
    )
    report = reconcile()
    assert ("missing_at_provider", ghost.provider_key) in kinds(report)


def test_different_amount_and_total(provider):
    payment = captured_payment("order-1")
    PaymentTransaction.objects.filter(payment=payment).update(amount=Decimal("9.00"))
    Payment.objects.filter(id=payment.id).update(amount_captured=F("amount_captured") - 1)
    report = reconcile()
    key = payment.transactions.get().provider_key
    assert kinds(report) == [("different_amount", key), ("different_total", "order-1")]


def test_a_pending_call_the_provider_applied_is_unrecorded(provider):
    payment = payment_create(
        reference="order-1",
        amount=Decimal("3.00"),
        currency="EUR",
        payment_method="pm_card_timeout",
    )
    payment_capture(payment_id=payment.id)  # charged; the answer was lost
    report = reconcile()
    key = payment.transactions.get().provider_key
    assert kinds(report) == [("unrecorded", key), ("different_total", "order-1")]


def test_command_exit_codes(provider):
    """The real command: 0 when clean, 1 on a difference, 2 when the ledger is unreadable."""

    def run():
        return subprocess.run(
            [sys.executable, "manage.py", "reconcile_payments"],
            cwd=ROOT,
            env=shop_env(provider),
            capture_output=True,
            text=True,
            timeout=60,
        )

    captured_payment("order-1")
    clean = run()
    assert clean.returncode == 0, clean.stderr
    assert "0 differences" in clean.stdout
    Payment.objects.update(amount_captured=Decimal("1.00"))
    dirty = run()
    assert dirty.returncode == 1
    assert "different_total\torder-1" in dirty.stdout
    provider.faults(refuse_connections=True)
    assert run().returncode == 2
