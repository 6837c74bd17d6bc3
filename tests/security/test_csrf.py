"""CSRF: every write a browser session can make is refused without the token.

The API (DRF's SessionAuthentication enforces Django's CSRF check for a
session-authenticated request; a token-authenticated call carries no
ambient credential and is exempt), the Django admin's forms (here without a
browser; tests/browser/test_admin.py::test_admin_post_without_csrf_token_is_refused
does the same in the slow browser suite). The storefront's forms are covered by
tests/shop/test_pages.py::test_every_storefront_form_refuses_a_post_without_its_csrf_token
and ::test_the_decision_page_forms_refuse_a_post_without_csrf; the provider's
webhook is CSRF-exempt and signed instead
(tests/payments/test_webhooks.py::test_endpoint_is_unauthenticated_and_csrf_exempt).
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from idempotency.models import IdempotencyKey
from orders.models import Order, ReturnRequest
from payments.models import Refund
from tests.conftest import assert_problem
from tests.security.conftest import ADDRESS

pytestmark = pytest.mark.django_db

ORDER = {
    "lines": [{"sku": "TEE-M", "quantity": 20}],
    "on_shortage": "ask",
    "payment_method": "pm_card_ok",
    "shipping_address": ADDRESS,
}


def session_client(user) -> APIClient:
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def csrf_token(client) -> str:
    assert client.get("/accounts/logout/").status_code == 200  # a page with a form
    return client.cookies["csrftoken"].value


def test_session_api_order_without_csrf_token_is_403_and_nothing_happens(world):
    client = session_client(world.bob)
    orders = Order.objects.count()
    response = client.post("/api/v1/orders/", ORDER, format="json", HTTP_IDEMPOTENCY_KEY="c-1")
    problem = assert_problem(response, 403, "permission_denied")
    assert "CSRF" in problem["detail"]
    assert Order.objects.count() == orders
    assert not IdempotencyKey.objects.filter(owner=world.bob).exists()
    # A forged token is no better than none.
    forged = client.post(
        "/api/v1/orders/", ORDER, format="json", HTTP_IDEMPOTENCY_KEY="c-1",
        HTTP_X_CSRFTOKEN="x" * 64,
    )  # fmt: skip
    assert_problem(forged, 403, "permission_denied")
    assert Order.objects.count() == orders


def test_session_api_order_with_the_csrf_token_is_placed(world):
    client = session_client(world.bob)
    token = csrf_token(client)
    response = client.post(
        "/api/v1/orders/", ORDER, format="json", HTTP_IDEMPOTENCY_KEY="c-1", HTTP_X_CSRFTOKEN=token
    )
    assert response.status_code == 201, response.content
    assert Order.objects.get(id=response.json()["id"]).owner == world.bob


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/api/v1/orders/{asked}/cancel/", None),
        ("post", "/api/v1/orders/{asked}/confirm/", None),
        ("post", "/api/v1/orders/{order}/returns/", {"lines": [{"sku": "TEE-M", "quantity": 1}]}),
        ("delete", "/api/v1/auth/account/", None),
    ],
    ids=["cancel", "confirm", "return_create", "account_delete"],
)
def test_every_session_api_write_needs_the_csrf_token(world, method, path, body):
    client = session_client(world.alice)
    before = (
        sorted(Order.objects.values_list("id", "status")),
        ReturnRequest.objects.count(),
    )
    response = getattr(client, method)(
        path.format(**world.ids()), body, format="json", HTTP_IDEMPOTENCY_KEY="c-2"
    )
    assert_problem(response, 403, "permission_denied")
    after = (sorted(Order.objects.values_list("id", "status")), ReturnRequest.objects.count())
    assert after == before
    assert get_user_model().objects.get(pk=world.alice.pk).is_active


@pytest.mark.parametrize("staff", [False, True], ids=["shopper_token", "staff_token"])
def test_token_authenticated_writes_need_no_csrf_token(world, staff):
    client = world.staff_client if staff else world.bob_client
    client.handler.enforce_csrf_checks = True
    if staff:
        response = client.post(
            "/api/v1/products/TEE-M/stock/", {"delta": 1}, format="json", HTTP_IDEMPOTENCY_KEY="t"
        )
        assert response.status_code == 200, response.content
    else:
        response = client.post("/api/v1/orders/", ORDER, format="json", HTTP_IDEMPOTENCY_KEY="t")
        assert response.status_code == 201, response.content


def test_admin_refund_and_mark_received_forms_refuse_a_post_without_csrf(world, django_user_model):
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    browser.force_login(
        django_user_model.objects.create_superuser("root", "root@example.com", "pw-unused-1")
    )
    assert browser.get(f"/admin/orders/order/{world.shipped.id}/refund/").status_code == 200
    refund = browser.post(
        f"/admin/orders/order/{world.shipped.id}/refund/",
        {"amount": "1.00", "reason": "goodwill", "idempotency_key": "a-1"},
    )
    assert refund.status_code == 403
    assert b"security token was missing" in refund.content  # the CSRF refusal, not a permission
    received = browser.post(
        "/admin/orders/returnrequest/",
        {"action": "mark_received", "_selected_action": [str(world.order_return.id)]},
    )
    assert received.status_code == 403 and b"security token was missing" in received.content
    product = browser.post(
        "/admin/inventory/product/add/", {"sku": "X", "name": "X", "price": "1.00"}
    )
    assert product.status_code == 403 and b"security token was missing" in product.content
    assert Refund.objects.count() == 0
    world.order_return.refresh_from_db()
    assert world.order_return.status == "requested"
