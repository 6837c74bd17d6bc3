"""A shopper never reads nor acts on another shopper's objects: 404, never 403.

One table for every endpoint of the contract that names a shopper's object
(orders, returns, shipments' tracking, refunds) and one for those that only
ever answer the caller's own data (the order list, points, history). For
each object row the stranger's 404 is the same problem as for an id that
does not exist (no existence oracle), the owner's own request is the control
that proves the object is there, and a refused write changes nothing and
stores no request key.
"""

from __future__ import annotations

import uuid

import pytest
from django.test import Client

from idempotency.models import IdempotencyKey
from orders.models import Order, ReturnRequest, Shipment
from payments.models import Refund
from tests.conftest import assert_problem

pytestmark = pytest.mark.django_db

MISSING = str(uuid.UUID(int=7))

# (name, method, path, body): paths are formatted with World.ids().
OBJECT_ENDPOINTS = [
    ("order_detail", "get", "/api/v1/orders/{order}/", None),
    ("order_refunds_list", "get", "/api/v1/orders/{order}/refunds/", None),
    ("return_detail", "get", "/api/v1/returns/{return}/", None),
    ("tracking_read", "get", "/api/v1/shipments/{shipment}/tracking-events/", None),
    ("order_confirm", "post", "/api/v1/orders/{asked}/confirm/", None),
    ("order_cancel", "post", "/api/v1/orders/{asked}/cancel/", None),
    ("order_cancel_confirmed", "post", "/api/v1/orders/{order}/cancel/", None),
    (
        "return_create",
        "post",
        "/api/v1/orders/{order}/returns/",
        {"lines": [{"sku": "TEE-M", "quantity": 1}], "reason": "mine now"},
    ),
]


def _call(client, method, path, body, key="stranger-key-1"):
    if method == "get":
        return client.get(path)
    return client.post(path, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def _state() -> tuple:
    return (
        sorted(Order.objects.values_list("id", "status", "fulfillment")),
        sorted(ReturnRequest.objects.values_list("id", "status")),
        Shipment.objects.count(),
        Refund.objects.count(),
    )


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [case[1:] for case in OBJECT_ENDPOINTS],
    ids=[case[0] for case in OBJECT_ENDPOINTS],
)
def test_another_shoppers_object_is_404_and_nothing_changes(world, method, path, body):
    ids = world.ids()
    before = _state()
    response = _call(world.bob_client, method, path.format(**ids), body)
    problem = assert_problem(response, 404, "not_found")
    # The same answer as for an id that exists nowhere: nothing tells them apart.
    missing = _call(
        world.bob_client,
        method,
        path.format(**{k: MISSING if k != "sku" else v for k, v in ids.items()}),
        body,
        key="stranger-key-2",
    )
    assert assert_problem(missing, 404, "not_found") == problem
    for secret in (str(world.shipped.number), "Alice Example", "1 Private Road", "alice"):
        assert secret not in response.content.decode()
    assert _state() == before
    assert not IdempotencyKey.objects.filter(owner=world.bob).exists()


@pytest.mark.parametrize(
    "path",
    [case[2] for case in OBJECT_ENDPOINTS if case[1] == "get"],
    ids=[case[0] for case in OBJECT_ENDPOINTS if case[1] == "get"],
)
def test_the_owner_and_staff_read_the_same_object(world, path):
    """The control of the table: the objects exist and are readable by who may."""
    path = path.format(**world.ids())
    assert world.alice_client.get(path).status_code == 200
    assert world.staff_client.get(path).status_code == 200


# (name, path, what alice sees, what bob sees)
OWN_ONLY_ENDPOINTS = [
    ("order_list", "/api/v1/orders/"),
    ("loyalty", "/api/v1/loyalty/"),
    ("purchase_history", "/api/v1/purchase-history/"),
]


def _own(world, name, body) -> object:
    if name == "order_list":
        return sorted(o["id"] for o in body["results"])
    if name == "loyalty":
        return body["balance"]
    return [(r["order_number"], r["sku"], r["quantity"]) for r in body["results"]]


@pytest.mark.parametrize(
    "name, path", OWN_ONLY_ENDPOINTS, ids=[case[0] for case in OWN_ONLY_ENDPOINTS]
)
def test_points_history_and_order_list_are_only_ever_the_callers_own(world, name, path):
    alice = world.alice_client.get(path)
    bob = world.bob_client.get(path)
    assert alice.status_code == bob.status_code == 200
    expected_alice = {
        "order_list": sorted([str(world.shipped.id), str(world.asked.id)]),
        "loyalty": 20,
        "purchase_history": [(world.shipped.number, "TEE-M", 2)],
    }[name]
    assert _own(world, name, alice.json()) == expected_alice
    assert _own(world, name, bob.json()) in ([], 0)
    # No query string selects someone else's data.
    for query in (f"?owner={world.alice.pk}", f"?user={world.alice.pk}", "?user_id=alice"):
        again = world.bob_client.get(path + query)
        assert again.status_code in (200, 400)
        if again.status_code == 200:
            assert _own(world, name, again.json()) in ([], 0)


STOREFRONT_PAGES = [
    ("order_page", "get", "/orders/{order}/"),
    ("order_status", "get", "/orders/{order}/status/"),
    ("order_return_form", "get", "/orders/{order}/return/"),
    ("order_return_post", "post", "/orders/{order}/return/"),
    ("order_confirm_post", "post", "/orders/{asked}/confirm/"),
    ("order_cancel_post", "post", "/orders/{asked}/cancel/"),
]


@pytest.mark.parametrize(
    "method, path", [c[1:] for c in STOREFRONT_PAGES], ids=[c[0] for c in STOREFRONT_PAGES]
)
def test_storefront_pages_of_another_shoppers_order_are_404(world, method, path):
    browser = Client()
    browser.force_login(world.bob)
    before = _state()
    path = path.format(**world.ids())
    if method == "get":
        response = browser.get(path)
    else:
        response = browser.post(path, {"idempotency_key": "k-1", "sku": "TEE-M", "quantity": "1"})
    assert response.status_code == 404, (response.status_code, response.content[:300])
    assert str(world.shipped.number) not in response.content.decode()
    assert _state() == before
    owner = Client()
    owner.force_login(world.alice)
    if method == "get":
        assert owner.get(path).status_code == 200
