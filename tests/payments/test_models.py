"""The database itself refuses impossible money states."""

from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction
from django.db.models import F

from payments.models import Payment, PaymentTransaction


def constraint_of(exc: IntegrityError) -> str:
    return exc.__cause__.diag.constraint_name


@pytest.fixture
def payment(db):
    return Payment.objects.create(
        reference="order-1",
        amount=Decimal("10.00"),
        currency="EUR",
        payment_method="pm_card_ok",
        amount_authorized=Decimal("10.00"),
        amount_captured=Decimal("10.00"),
    )


@pytest.mark.parametrize(
    ("changes", "constraint"),
    [
        ({"amount_refunded": F("amount_captured") + 1}, "payments_payment_refunded_le_captured"),
        ({"amount_refunded": -1}, "payments_payment_refunded_non_negative"),
        (
            {"amount_captured": F("amount_authorized") + 1},
            "payments_payment_captured_le_authorized",
        ),
        ({"amount_authorized": F("amount") + 1}, "payments_payment_authorized_le_amount"),
        ({"status": "paid"}, "payments_payment_status_valid"),
        (
            {"amount": 0, "amount_authorized": 0, "amount_captured": 0},
            "payments_payment_amount_positive",
        ),
    ],
)
def test_check_constraints(payment, changes, constraint):
    with pytest.raises(IntegrityError) as info, transaction.atomic():
        Payment.objects.filter(id=payment.id).update(**changes)
    assert constraint_of(info.value) == constraint


def test_reference_is_unique(payment):
    with pytest.raises(IntegrityError) as info, transaction.atomic():
        Payment.objects.create(
            reference="order-1", amount=Decimal("1.00"), currency="EUR", payment_method="pm_card_ok"
        )
    assert constraint_of(info.value) == "payments_payment_reference_uniq"


def test_one_transaction_per_payment_kind_and_key(payment):
    PaymentTransaction.objects.create(
        payment=payment, kind="capture", provider_key="i:order-1:capture", amount=1, currency="EUR"
    )
    with pytest.raises(IntegrityError) as info, transaction.atomic():
        PaymentTransaction.objects.create(
            payment=payment,
            kind="capture",
            provider_key="i:order-1:capture",
            amount=1,
            currency="EUR",
        )
    assert constraint_of(info.value) == "payments_transaction_payment_kind_key_uniq"
