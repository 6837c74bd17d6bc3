"""Staff see payments and settlements read-only and can retry a settlement that needs attention."""

from decimal import Decimal

import pytest
from django.db.models.functions import Now

from payments.capture import payment_create
from payments.models import PaymentSettlement, PaymentTransaction
from payments.selectors import settlements_needing_attention

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client, make_user):
    staff = make_user(staff=True)
    staff.is_superuser = True
    staff.save()
    client.force_login(staff)
    return client


@pytest.mark.parametrize("model", ["payment", "paymentsettlement"])
def test_payment_admin_is_read_only(staff_client, model):
    assert staff_client.get(f"/admin/payments/{model}/").status_code == 200
    assert staff_client.get(f"/admin/payments/{model}/add/").status_code == 403


def test_retry_now_gives_a_fresh_budget(staff_client):
    payment = payment_create(
        reference="order-admin", amount=Decimal("5.00"), currency="EUR", payment_method="pm_card_ok"
    )
    txn = PaymentTransaction.objects.create(
        payment=payment,
        kind="capture",
        provider_key="k-admin",
        amount=payment.amount,
        currency="EUR",
    )
    settlement = PaymentSettlement.objects.create(
        transaction=txn, attempts=12, needs_attention=True, next_attempt_at=Now()
    )
    response = staff_client.post(
        "/admin/payments/paymentsettlement/",
        {"action": "retry_now", "_selected_action": [settlement.id]},
    )
    assert response.status_code == 302
    settlement.refresh_from_db()
    assert (settlement.needs_attention, settlement.attempts) == (False, 0)


def test_settlements_needing_attention_lists_the_open_flagged_ones():
    # It filtered on `settled_at`, a property (the field is `done_at`): a FieldError.
    payment = payment_create(
        reference="order-attn", amount=Decimal("5.00"), currency="EUR", payment_method="pm_card_ok"
    )
    flagged, done, fine = (
        PaymentSettlement.objects.create(
            transaction=PaymentTransaction.objects.create(
                payment=payment,
                kind="capture",
                provider_key=f"k-attn-{n}",
                amount=1,
                currency="EUR",
            ),
            needs_attention=attention,
            next_attempt_at=Now(),
            done_at=Now() if finished else None,
        )
        for n, (attention, finished) in enumerate([(True, False), (True, True), (False, False)])
    )
    assert [s.id for s in settlements_needing_attention()] == [flagged.id]
