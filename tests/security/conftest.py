"""One small shop for the security tests: alice's objects, bob the stranger, a courier, staff.

Everything is made directly through the services (no payment provider, no
server process): alice has a shipped order (with a shipment and a requested
return) and an order awaiting her decision; she has points and a purchase
history. Bob is another shopper with nothing of his own.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
from rest_framework.test import APIClient

from orders.models import Order, ReturnRequest, Shipment
from shop import events, history, loyalty
from tests.orders.conftest import line_requests
from tests.orders.shipping import confirm, ship

ADDRESS = {
    "name": "Alice Example",
    "line1": "1 Private Road",
    "city": "Leeds",
    "postal_code": "LS1 1AA",
    "country": "GB",
}


@dataclass
class World:
    alice: object
    bob: object
    alice_client: APIClient
    bob_client: APIClient
    courier_client: APIClient
    staff_client: APIClient
    anonymous: APIClient
    shipped: Order
    asked: Order
    shipment: Shipment
    order_return: ReturnRequest

    def ids(self) -> dict[str, str]:
        return {
            "order": str(self.shipped.id),
            "asked": str(self.asked.id),
            "shipment": str(self.shipment.id),
            "return": str(self.order_return.id),
            "sku": "TEE-M",
        }


def _hold(owner, lines, on_shortage="reject"):
    from orders.services import order_hold

    return order_hold(
        owner=owner,
        lines=line_requests(lines),
        on_shortage=on_shortage,
        payment_method="pm_card_ok",
        shipping_address=ADDRESS,
    )


@pytest.fixture
def world(db, make_user, make_product, client_for) -> World:
    from orders.returns import ReturnLineRequest, return_request

    make_product("TEE-M", price="10.00", stock=10)
    make_product("MUG", price="7.00", stock=1)
    alice, bob = make_user(username="alice"), make_user(username="bob")
    shipped = confirm(_hold(alice, {"TEE-M": 2}))
    shipment = ship(shipped)
    asked = _hold(alice, {"MUG": 2}, on_shortage="ask")
    assert asked.status == "awaiting_decision"
    order_return = return_request(
        order_id=shipped.id,
        lines=[ReturnLineRequest(sku="TEE-M", quantity=1)],
        reason="too small",
        requested_by=alice,
    )
    payload = {
        "order_id": str(shipped.id),
        "number": shipped.number,
        "owner_id": alice.pk,
        "status": "confirmed",
        "total": "20.00",
        "currency": "EUR",
        "lines": [
            {
                "sku": "TEE-M",
                "quantity_requested": 2,
                "quantity_confirmed": 2,
                "unit_price": "10.00",
                "status": "confirmed",
            }
        ],
    }
    loyalty.loyalty_apply(
        event_id=str(uuid.uuid4()), event_type=events.ORDER_CONFIRMED, payload=payload
    )
    history.history_apply(
        message_id=str(uuid.uuid4()), event_type=events.ORDER_CONFIRMED, payload=payload
    )
    return World(
        alice=alice,
        bob=bob,
        alice_client=client_for(alice),
        bob_client=client_for(bob),
        courier_client=client_for(make_user(courier=True)),
        staff_client=client_for(make_user(actions=True)),
        anonymous=APIClient(),
        shipped=shipped,
        asked=asked,
        shipment=shipment,
        order_return=order_return,
    )
