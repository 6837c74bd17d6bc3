"""Issue 9: a 4xx that is not the provider's own answer never fails a charged order.

A `pm_card_timeout` checkout has charged the customer and lost the answer.
Then something in front of the provider turns the shop away: a rotated API
key (401), a firewall (403), a misrouted base URL (a bare 404 on every
path). None of these says what became of the charge, so the order must stay
`payment_pending` with its stock held until the provider itself answers.

Real PostgreSQL, a real simulator process; the shop runs in this process
(APIClient) and settles with `settle_due` (one attempt, as a worker would).
"""

import uuid

import pytest

from inventory.models import Reservation, StockItem
from orders.models import Order
from payments.models import PaymentEvent, PaymentSettlement, PaymentStatus
from payments.settlement import payment_settle, settlement_retry_now
from tests.orders.conftest import ADDRESS
from tests.support.simulator import assert_reconciled, reconcile, settle_due

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

REJECTIONS = [
    pytest.param(401, id="401-rotated-key"),
    pytest.param(403, id="403-firewall"),
    pytest.param(404, id="404-bare-misroute"),
]


@pytest.fixture
def shopper_api(shopper_client, provider, make_product):
    make_product("TEE-M", price="19.99", stock=5)
    return shopper_client


def place(client, key):
    body = {
        "lines": [{"sku": "TEE-M", "quantity": 2}],
        "on_shortage": "reject",
        "payment_method": "pm_card_timeout",
        "shipping_address": ADDRESS,
    }
    return client.post("/api/v1/orders/", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def charged_and_pending(shopper_api, provider, status) -> tuple[str, Order]:
    """Place a `pm_card_timeout` order (charged, answer lost), then turn the shop away."""
    key = uuid.uuid4().hex
    response = place(shopper_api, key)
    assert response.status_code == 202, response.content
    assert response.json()["status"] == "payment_pending"
    order = Order.objects.get()
    assert len(charges(provider, order)) == 1
    # Look-ups and calls alike: a re-send must not be taken as a decline either.
    provider.faults(reject_lookups=status, reject_calls=status)
    return key, order


def charges(provider, order) -> list[dict]:
    return provider.charges(order.payment.transactions.get(kind="capture").provider_key)


def assert_still_pending(order) -> None:
    """The order, its payment and its held stock are as the timeout left them."""
    order.refresh_from_db()
    assert order.status == "payment_pending"
    assert order.payment.status == PaymentStatus.PENDING
    stock = StockItem.objects.get(product__sku="TEE-M")
    assert (stock.on_hand, stock.reserved) == (5, 2)
    assert set(Reservation.objects.values_list("state", flat=True)) == {"held"}
    settlement = PaymentSettlement.objects.get(transaction__payment=order.payment)
    assert settlement.settled_at is None


@pytest.mark.parametrize("status", REJECTIONS)
def test_rejected_lookups_keep_the_order_pending_until_the_provider_answers(
    shopper_api, provider, status
):
    key, order = charged_and_pending(shopper_api, provider, status)

    retry = place(shopper_api, key)  # the retry's one look-up is turned away
    assert retry.status_code == 202, retry.content
    assert retry.json()["status"] == "payment_pending"
    assert_still_pending(order)

    settle_due(order.payment)  # settlement's look-up is turned away too
    assert_still_pending(order)
    assert PaymentSettlement.objects.get(transaction__payment=order.payment).attempts == 1
    assert provider.state()["stats"][f"reject_lookups.{status}"] == 2
    assert place(shopper_api, key).status_code == 202
    assert reconcile()["clean"] is False  # the provider's charge is not recorded yet

    provider.faults(reject_lookups=None, reject_calls=None)
    settle_due(order.payment)
    order.refresh_from_db()
    assert order.status == "confirmed"
    assert order.payment.status == PaymentStatus.CAPTURED
    stock = StockItem.objects.get(product__sku="TEE-M")
    assert (stock.on_hand, stock.reserved) == (3, 0)
    assert len(charges(provider, order)) == 1
    final = place(shopper_api, key)
    assert final.status_code == 201 and final.json()["status"] == "confirmed"
    assert_reconciled()


@pytest.mark.parametrize("status", REJECTIONS)
def test_rejections_past_the_budget_need_attention_and_never_fail_the_order(
    shopper_api, provider, settings, status
):
    settings.PAYMENTS_SETTLE_MAX_ATTEMPTS = 2
    key, order = charged_and_pending(shopper_api, provider, status)

    for attempt in (1, 2):
        settlement = settle_due(order.payment)
        assert settlement.attempts == attempt
        assert_still_pending(order)
    assert settlement.needs_attention is True
    assert str(status) in settlement.last_error
    assert settle_due(order.payment).attempts == 2  # no third attempt
    assert PaymentEvent.objects.filter(payment=order.payment, kind="needs_attention").count() == 1
    assert order.status != "payment_failed"
    retry = place(shopper_api, key)
    assert retry.status_code == 202 and retry.json()["status"] == "payment_pending"
    assert_still_pending(order)

    # Staff fix the key and retry: the provider's own answer finishes it, charged once.
    provider.faults(reject_lookups=None, reject_calls=None)
    settlement_retry_now(settlement_id=settlement.id)
    payment_settle(settlement_id=settlement.id)
    order.refresh_from_db()
    assert order.status == "confirmed"
    assert len(charges(provider, order)) == 1
    assert_reconciled()
