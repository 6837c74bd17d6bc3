"""Request keys belong to their user: the same key from another user is their own, independent run.

Never a replay of someone else's stored answer (which would leak their
order), never a 409/422 conflict with someone else's request (which would let
one user block or probe another's keys).
"""

from __future__ import annotations

import pytest

from idempotency.models import IdempotencyKey
from inventory.models import StockItem
from orders.models import Order
from tests.conftest import assert_problem
from tests.security.conftest import ADDRESS

pytestmark = pytest.mark.django_db

KEY = "shared-key-0001"


def order_body(quantity: int, sku: str = "KEYED") -> dict:
    return {
        "lines": [{"sku": sku, "quantity": quantity}],
        "on_shortage": "ask",
        "payment_method": "pm_card_ok",
        "shipping_address": ADDRESS,
    }


def place(client, body, key=KEY):
    return client.post("/api/v1/orders/", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_same_key_same_body_from_another_shopper_is_their_own_order(world, make_product):
    make_product("KEYED", price="3.00", stock=3)
    first = place(world.alice_client, order_body(4))
    assert first.status_code == 201 and first.json()["status"] == "awaiting_decision"
    assert "Idempotent-Replayed" not in first

    # Bob, same key, same body: his own run (the stock is held by alice now).
    theirs = place(world.bob_client, order_body(4))
    assert "Idempotent-Replayed" not in theirs
    assert_problem(theirs, 409, "insufficient_stock")
    assert str(first.json()["id"]) not in theirs.content.decode()

    # Each user's retry replays their own answer only.
    again = place(world.alice_client, order_body(4))
    assert again["Idempotent-Replayed"] == "true" and again.json() == first.json()
    bob_again = place(world.bob_client, order_body(4))
    assert bob_again["Idempotent-Replayed"] == "true"
    assert bob_again.json() == theirs.json()
    assert Order.objects.filter(owner=world.bob).count() == 0
    assert IdempotencyKey.objects.filter(key=KEY).count() == 2


def test_same_key_other_body_from_another_shopper_is_not_a_conflict(world, make_product):
    make_product("KEYED", price="3.00", stock=10)
    make_product("OTHER", price="2.00", stock=1)
    assert place(world.alice_client, order_body(11)).status_code == 201
    # 422 idempotency_key_reused would be alice's fingerprint leaking into bob's run.
    response = place(world.bob_client, order_body(2, sku="OTHER"))
    assert response.status_code == 201, response.content
    assert response.json()["status"] == "awaiting_decision"
    assert Order.objects.get(id=response.json()["id"]).owner == world.bob


def test_same_key_from_another_staff_member_changes_stock_again(world, make_user, client_for):
    """Two staff members, one key, one body: two independent stock changes."""
    other_staff = client_for(make_user(actions=True))
    path = "/api/v1/products/TEE-M/stock/"
    on_hand = StockItem.objects.get(product__sku="TEE-M").on_hand
    one = world.staff_client.post(path, {"delta": 5}, format="json", HTTP_IDEMPOTENCY_KEY=KEY)
    two = other_staff.post(path, {"delta": 5}, format="json", HTTP_IDEMPOTENCY_KEY=KEY)
    assert one.status_code == two.status_code == 200
    assert "Idempotent-Replayed" not in two
    assert (one.json()["on_hand"], two.json()["on_hand"]) == (on_hand + 5, on_hand + 10)
    replay = other_staff.post(path, {"delta": 5}, format="json", HTTP_IDEMPOTENCY_KEY=KEY)
    assert replay["Idempotent-Replayed"] == "true" and replay.json() == two.json()
    assert StockItem.objects.get(product__sku="TEE-M").on_hand == on_hand + 10


def test_a_key_used_on_someone_elses_order_replays_nothing_of_theirs(world):
    path = f"/api/v1/orders/{world.asked.id}/cancel/"
    mine = world.alice_client.post(path, format="json", HTTP_IDEMPOTENCY_KEY=KEY)
    assert mine.status_code == 200 and mine.json()["status"] == "cancelled"
    theirs = world.bob_client.post(path, format="json", HTTP_IDEMPOTENCY_KEY=KEY)
    assert_problem(theirs, 404, "not_found")
    assert "Idempotent-Replayed" not in theirs
    assert not IdempotencyKey.objects.filter(owner=world.bob).exists()
