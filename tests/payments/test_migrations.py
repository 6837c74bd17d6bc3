"""payments/0004 rewrites the stored transaction status "pending" as "unknown".

Run on a database holding the old value: migrated back to 0003, rows written
as the previous release wrote them, migrated forward, read again.
"""

from decimal import Decimal

import pytest

from tests.support.migrating import migrate, migrate_to_latest

BEFORE = ("payments", "0003_refunds")
AFTER = ("payments", "0004_transaction_status_unknown")


@pytest.fixture
def at_0003(transactional_db):
    apps = migrate(BEFORE)
    yield apps
    migrate_to_latest()


def _transactions(apps, statuses: list[str]) -> list[int]:
    Payment = apps.get_model("payments", "Payment")
    PaymentTransaction = apps.get_model("payments", "PaymentTransaction")
    payment = Payment.objects.create(
        reference="order-1", amount=Decimal("10.00"), currency="EUR", payment_method="pm_card_ok"
    )
    return [
        PaymentTransaction.objects.create(
            payment=payment,
            kind="capture",
            provider_key=f"install:order-1:capture:{n}",
            amount=Decimal("10.00"),
            currency="EUR",
            status=status,
        ).id
        for n, status in enumerate(statuses)
    ]


def _statuses(apps, ids: list[int]) -> list[str]:
    PaymentTransaction = apps.get_model("payments", "PaymentTransaction")
    by_id = dict(PaymentTransaction.objects.filter(id__in=ids).values_list("id", "status"))
    return [by_id[i] for i in ids]


def test_pending_transactions_become_unknown_and_back(at_0003):
    ids = _transactions(at_0003, ["pending", "succeeded", "declined", "pending"])

    after = migrate(AFTER)
    assert _statuses(after, ids) == ["unknown", "succeeded", "declined", "unknown"]
    assert (
        after.get_model("payments", "PaymentTransaction")._meta.get_field("status").default
        == "unknown"
    )

    before = migrate(BEFORE)
    assert _statuses(before, ids) == ["pending", "succeeded", "declined", "pending"]


def test_the_model_has_no_pending_transaction_status():
    from payments.models import TransactionStatus

    assert TransactionStatus.values == ["unknown", "succeeded", "declined"]
