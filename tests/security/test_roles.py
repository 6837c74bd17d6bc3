"""Roles: staff-only endpoints refuse shoppers and couriers; couriers only post tracking events.

Refused is 403 `permission_denied` problem+json for a signed-in user who
lacks the role and 401 `not_authenticated` for nobody, before the request
key or the body is looked at, and nothing changes. `/metrics` answers 403
to anyone but loopback and staff (docs/operations.md: it is a public
endpoint, a 401 would invite credentials a scraper does not have).
Each row's staff call is the control: the same request gets past the gate.
"""

from __future__ import annotations

import pytest

from idempotency.models import IdempotencyKey
from inventory.models import StockItem
from orders.models import Order, ReturnRequest, Shipment, TrackingEvent
from payments.models import Refund
from tests.conftest import assert_problem

pytestmark = pytest.mark.django_db

REMOTE = {"REMOTE_ADDR": "203.0.113.7"}
TRACKING = {
    "event_id": "ev-1",
    "status": "in_transit",
    "occurred_at": "2026-05-01T10:00:00Z",
    "location": "Hub A",
}

# (name, method, path, body); every keyed endpoint gets a key.
STAFF_ONLY = [
    (
        "product_create",
        "post",
        "/api/v1/products/",
        {"sku": "NEW", "name": "New", "price": "1.00", "currency": "EUR", "stock": 1},
    ),
    ("stock_change", "post", "/api/v1/products/{sku}/stock/", {"delta": 5}),
    (
        "refund_create",
        "post",
        "/api/v1/orders/{order}/refunds/",
        {"amount": "1.00", "currency": "EUR", "reason": "goodwill"},
    ),
    ("shipment_create", "post", "/api/v1/orders/{order}/shipments/", {}),
    ("return_receive", "post", "/api/v1/returns/{return}/receive/", None),
    ("daily_sales_reports", "get", "/api/v1/reports/daily-sales/", None),
    ("metrics_remote", "get", "/metrics", None),
]

# Every order endpoint: a courier gets 403 on each (they may only post tracking events).
ORDER_ENDPOINTS = [
    ("order_list", "get", "/api/v1/orders/", None),
    (
        "order_place",
        "post",
        "/api/v1/orders/",
        {
            "lines": [{"sku": "TEE-M", "quantity": 1}],
            "on_shortage": "ask",
            "payment_method": "pm_card_ok",
            "shipping_address": {
                "name": "C",
                "line1": "1 Road",
                "city": "X",
                "postal_code": "1",
                "country": "GB",
            },
        },
    ),
    ("order_detail", "get", "/api/v1/orders/{order}/", None),
    ("order_confirm", "post", "/api/v1/orders/{asked}/confirm/", None),
    ("order_cancel", "post", "/api/v1/orders/{asked}/cancel/", None),
    ("order_refunds_list", "get", "/api/v1/orders/{order}/refunds/", None),
    (
        "return_create",
        "post",
        "/api/v1/orders/{order}/returns/",
        {"lines": [{"sku": "TEE-M", "quantity": 1}], "reason": "x"},
    ),
    ("return_detail", "get", "/api/v1/returns/{return}/", None),
    ("tracking_read", "get", "/api/v1/shipments/{shipment}/tracking-events/", None),
]


def _call(client, method, path, body, key="role-key-1"):
    extra = REMOTE if path == "/metrics" else {}
    if method == "get":
        return client.get(path, **extra)
    return client.post(path, body, format="json", HTTP_IDEMPOTENCY_KEY=key, **extra)


def _state() -> tuple:
    return (
        sorted(Order.objects.values_list("id", "status", "fulfillment")),
        sorted(ReturnRequest.objects.values_list("id", "status")),
        sorted(StockItem.objects.values_list("product__sku", "on_hand", "reserved")),
        Shipment.objects.count(),
        Refund.objects.count(),
        TrackingEvent.objects.count(),
        IdempotencyKey.objects.count(),
    )


def _ids(cases):
    return [case[0] for case in cases]


@pytest.mark.parametrize("who", ["owner_shopper", "other_shopper", "courier"])
@pytest.mark.parametrize(("name", "method", "path", "body"), STAFF_ONLY, ids=_ids(STAFF_ONLY))
def test_staff_only_endpoints_refuse_shoppers_and_couriers(world, who, name, method, path, body):
    client = {
        "owner_shopper": world.alice_client,
        "other_shopper": world.bob_client,
        "courier": world.courier_client,
    }[who]
    before = _state()
    assert_problem(
        _call(client, method, path.format(**world.ids()), body), 403, "permission_denied"
    )
    assert _state() == before


@pytest.mark.parametrize(("name", "method", "path", "body"), STAFF_ONLY, ids=_ids(STAFF_ONLY))
def test_staff_only_endpoints_refuse_anonymous_and_let_staff_through(
    world, name, method, path, body
):
    before = _state()
    response = _call(world.anonymous, method, path.format(**world.ids()), body)
    if path == "/metrics":
        assert_problem(response, 403, "permission_denied")
    else:
        assert_problem(response, 401, "not_authenticated")
        assert response["WWW-Authenticate"].startswith("Token")
    assert _state() == before
    allowed = _call(world.staff_client, method, path.format(**world.ids()), body)
    assert allowed.status_code not in (401, 403), (allowed.status_code, allowed.content[:300])


@pytest.mark.parametrize(
    ("name", "method", "path", "body"), ORDER_ENDPOINTS, ids=_ids(ORDER_ENDPOINTS)
)
def test_couriers_get_403_on_every_order_endpoint(world, name, method, path, body):
    before = _state()
    response = _call(world.courier_client, method, path.format(**world.ids()), body)
    assert_problem(response, 403, "permission_denied")
    assert _state() == before
    # Anonymous is 401 on the same endpoints (authentication is checked first).
    anonymous = _call(world.anonymous, method, path.format(**world.ids()), body)
    assert_problem(anonymous, 401, "not_authenticated")


def test_couriers_and_staff_may_post_tracking_events_shoppers_may_not(world):
    path = f"/api/v1/shipments/{world.shipment.id}/tracking-events/"
    for shopper in (world.alice_client, world.bob_client):
        assert_problem(shopper.post(path, TRACKING, format="json"), 403, "permission_denied")
    assert_problem(world.anonymous.post(path, TRACKING, format="json"), 401, "not_authenticated")
    assert TrackingEvent.objects.count() == 0
    assert world.courier_client.post(path, TRACKING, format="json").status_code == 202
    staff = world.staff_client.post(path, {**TRACKING, "event_id": "ev-2"}, format="json")
    assert staff.status_code == 202
    assert TrackingEvent.objects.count() == 2


def test_staff_may_not_confirm_a_shoppers_order(world):
    """Confirming charges the shopper's card: their decision, not staff's (README)."""
    response = world.staff_client.post(
        f"/api/v1/orders/{world.asked.id}/confirm/", format="json", HTTP_IDEMPOTENCY_KEY="s-1"
    )
    assert_problem(response, 403, "permission_denied")
    world.asked.refresh_from_db()
    assert world.asked.status == "awaiting_decision"


def test_staff_only_admin_pages_refuse_shoppers_and_couriers(world, client):
    for user in (world.alice, world.courier_client.user):
        client.force_login(user)
        for path in ("/admin/", "/admin/orders/order/", "/admin/idempotency/idempotencykey/"):
            response = client.get(path)
            assert response.status_code == 302 and "/admin/login/" in response["Location"], path
