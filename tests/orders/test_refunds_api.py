"""POST/GET /api/v1/orders/{id}/refunds/: strict input, keyed, never more than captured.

In-process (Django's test client) for the contract's answers; through a real
gunicorn for the concurrent requests, against the real simulator.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from decimal import Decimal

import pytest
import requests
from django.db import transaction

from core.api_tokens import api_token_issue
from orders.models import Order
from payments.models import Payment, Refund
from payments.refunds import refund_run
from tests.concurrency import wait_for_lock_waiters, wait_until
from tests.conftest import assert_problem
from tests.orders.conftest import ADDRESS
from tests.payments.refund_support import provider_refunds
from tests.support.simulator import assert_reconciled

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/v1/orders/{}/refunds/"


@pytest.fixture
def paid_order(provider, make_product, shopper_client):
    """A confirmed order whose 20.00 EUR were captured at the simulator."""
    make_product("TEE-M", price="10.00", stock=10)
    response = shopper_client.post(
        "/api/v1/orders/",
        {
            "lines": [{"sku": "TEE-M", "quantity": 2}],
            "payment_method": "pm_card_ok",
            "shipping_address": ADDRESS,
        },
        format="json",
        HTTP_IDEMPOTENCY_KEY="order-1",
    )
    assert response.status_code == 201, response.content
    order = Order.objects.select_related("payment").get(id=response.json()["id"])
    assert order.payment.amount_captured == Decimal("20.00")
    return order


def post(client, order, body, key):
    return client.post(URL.format(order.id), body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def nothing_reserved(order, provider) -> None:
    assert Refund.objects.count() == 0
    assert Payment.objects.get(id=order.payment_id).refund_reserved == 0
    assert provider_refunds(provider) == []


def test_refund_201_list_and_order_body(
    paid_order, staff_client, shopper_client, client_for, make_user, provider
):
    body = {"amount": "5.00", "currency": "EUR", "reason": "late delivery"}
    response = post(staff_client, paid_order, body, "r-1")
    assert response.status_code == 201, response.content
    refund = response.json()
    assert set(refund) == {"id", "order_id", "amount", "currency", "status", "reason"}
    assert refund["order_id"] == str(paid_order.id)
    assert (refund["amount"], refund["currency"], refund["status"]) == ("5.00", "EUR", "pending")

    refund_run(refund_id=refund["id"])  # the task's body, in this process
    listed = shopper_client.get(URL.format(paid_order.id))
    assert listed.status_code == 200
    assert listed.json()["next"] is None
    assert [(r["id"], r["status"]) for r in listed.json()["results"]] == [
        (refund["id"], "succeeded")
    ]
    assert staff_client.get(URL.format(paid_order.id)).status_code == 200
    stranger = client_for(make_user(username="eve"))
    assert_problem(stranger.get(URL.format(paid_order.id)), 404, "not_found")
    order = shopper_client.get(f"/api/v1/orders/{paid_order.id}/").json()
    assert order["payment"]["amount_refunded"] == "5.00"
    assert order["payment"]["status"] == "partially_refunded"
    assert_reconciled()


def test_only_staff_refund(paid_order, shopper_client, provider):
    body = {"amount": "5.00", "currency": "EUR", "reason": "x"}
    assert_problem(post(shopper_client, paid_order, body, "r-1"), 403, "permission_denied")
    nothing_reserved(paid_order, provider)


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"amount": 5.0, "currency": "EUR", "reason": "x"}, 400, "invalid_request"),
        ({"amount": 5, "currency": "EUR", "reason": "x"}, 400, "invalid_request"),
        ({"amount": "0.00", "currency": "EUR", "reason": "x"}, 400, "invalid_request"),
        ({"amount": "-1.00", "currency": "EUR", "reason": "x"}, 400, "invalid_request"),
        ({"amount": "5.001", "currency": "EUR", "reason": "x"}, 400, "invalid_request"),
        ({"amount": "5.00", "currency": "USD", "reason": "x"}, 422, "currency_mismatch"),
        ({"amount": "5.00", "currency": "EUR"}, 400, "invalid_request"),
        ({"amount": "5.00", "reason": "x"}, 400, "invalid_request"),
        ({"amount": "5.00", "currency": "EUR", "reason": "x", "extra": 1}, 400, "invalid_request"),
        ({"amount": "20.01", "currency": "EUR", "reason": "x"}, 422, "refund_exceeds_captured"),
    ],
)
def test_bad_input_reserves_and_sends_nothing(
    paid_order, staff_client, provider, body, status, code
):
    problem = assert_problem(post(staff_client, paid_order, body, "bad-1"), status, code)
    if code == "refund_exceeds_captured":
        assert problem["refundable"] == "20.00"
    nothing_reserved(paid_order, provider)


def test_nothing_captured_is_409(reserve, make_product, staff_client):
    make_product("MUG", price="3.00", stock=5)
    order = reserve({"MUG": 1})
    body = {"amount": "1.00", "currency": "EUR", "reason": "x"}
    assert_problem(post(staff_client, order, body, "r-1"), 409, "invalid_state")
    assert Refund.objects.count() == 0


def test_same_key_five_times_is_one_refund(paid_order, staff_client, provider):
    body = {"amount": "7.00", "currency": "EUR", "reason": "dented"}
    answers = [post(staff_client, paid_order, body, "same-key") for _ in range(5)]
    assert {a.status_code for a in answers} == {201}
    assert len({a.json()["id"] for a in answers}) == 1
    assert [a.headers.get("Idempotent-Replayed") for a in answers[1:]] == ["true"] * 4
    assert Refund.objects.count() == 1
    for _ in range(3):
        refund_run(refund_id=answers[0].json()["id"])
    assert len(provider_refunds(provider)) == 1
    assert Payment.objects.get(id=paid_order.payment_id).amount_refunded == Decimal("7.00")
    assert_reconciled()


# -- through a real gunicorn ------------------------------------------------------------


@pytest.fixture
def shop(gunicorn, provider):
    return gunicorn(
        workers=4,
        PAYMENTS_PROVIDER_URL=provider.url,
        PAYMENTS_PROVIDER_TIMEOUT="2",
        DB_POOL_MAX="2",
    )


def _send_all(server, token, order, bodies_and_keys) -> list[requests.Response]:
    """Send every request at once (barrier) from its own thread; return the answers."""
    barrier = threading.Barrier(len(bodies_and_keys))
    answers: list = [None] * len(bodies_and_keys)

    def send(index, body, key):
        barrier.wait(timeout=30)
        answers[index] = requests.post(
            f"{server.url}{URL.format(order.id)}",
            json=body,
            headers={"Authorization": f"Token {token}", "Idempotency-Key": key},
            timeout=60,
        )

    threads = [
        threading.Thread(target=send, args=(i, body, key), daemon=True)
        for i, (body, key) in enumerate(bodies_and_keys)
    ]
    return threads, answers


def _payment_held(order):
    """Hold the payment row (FOR NO KEY UPDATE): every reservation UPDATE queues behind it."""
    return Payment.objects.select_for_update(no_key=True).get(id=order.payment_id)


@pytest.mark.slow
def test_twenty_concurrent_with_one_key_are_one_refund(paid_order, shop, make_user, provider):
    token = api_token_issue(user=make_user(actions=True, username="ops")).key
    body = {"amount": "4.00", "currency": "EUR", "reason": "double click"}
    threads, answers = _send_all(shop, token, paid_order, [(body, "one-key")] * 20)
    with transaction.atomic():
        _payment_held(paid_order)
        for thread in threads:
            thread.start()
        wait_for_lock_waiters(1, timeout=60)  # the claimant is inside, at the reservation
        wait_until(lambda: sum(a is not None for a in answers) >= 5, timeout=60)
    for thread in threads:
        thread.join(60)
    tally = Counter(a.status_code for a in answers)
    assert set(tally) <= {201, 409} and tally[201] >= 1, tally
    assert tally[409] >= 5  # they overlapped the first one: idempotency_key_in_use
    assert {a.json()["code"] for a in answers if a.status_code == 409} == {"idempotency_key_in_use"}
    again = requests.post(
        f"{shop.url}{URL.format(paid_order.id)}",
        json=body,
        headers={"Authorization": f"Token {token}", "Idempotency-Key": "one-key"},
        timeout=60,
    )
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert Refund.objects.count() == 1
    refund_run(refund_id=again.json()["id"])
    assert len(provider_refunds(provider)) == 1
    assert_reconciled()


@pytest.mark.slow
def test_twenty_concurrent_refunds_never_exceed_captured(paid_order, shop, make_user, provider):
    token = api_token_issue(user=make_user(actions=True, username="ops")).key
    amounts = ["1.50", "2.00", "3.00", "2.50"] * 5  # 45.00 asked of 20.00 captured
    requests_ = [
        ({"amount": a, "currency": "EUR", "reason": "race"}, uuid.uuid4().hex) for a in amounts
    ]
    threads, answers = _send_all(shop, token, paid_order, requests_)
    with transaction.atomic():
        _payment_held(paid_order)
        for thread in threads:
            thread.start()
        wait_for_lock_waiters(4, timeout=60)  # every web worker waits on the payment row
    for thread in threads:
        thread.join(120)
    tally = Counter(a.status_code for a in answers)
    assert set(tally) <= {201, 422}, tally
    assert {a.json()["code"] for a in answers if a.status_code == 422} == {
        "refund_exceeds_captured"
    }
    granted = sum(Decimal(a.json()["amount"]) for a in answers if a.status_code == 201)
    assert granted <= Decimal("20.00")
    assert Payment.objects.get(id=paid_order.payment_id).refund_reserved == granted
    for refund in Refund.objects.all():
        refund_run(refund_id=refund.id)
    refunded = sum(Decimal(op["amount"]) for op in provider_refunds(provider))
    assert refunded == granted
    assert Payment.objects.get(id=paid_order.payment_id).amount_refunded == granted
    assert_reconciled()
