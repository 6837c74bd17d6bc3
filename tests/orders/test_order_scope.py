"""An order's business scope: one order per scope for the order's whole life, key or no key.

The storefront places an order with the scope of the cart version it shows
("cart:<id>:<version>", opaque to orders); the unique constraint
`orders_order_scope_uniq` decides, so a second placement of the same scope —
another request key, the old key purged, a race — is refused as
`already_ordered`, naming the first order, with nothing held. The API places
none (docs/checkout.md, "One order per cart version").
"""

from __future__ import annotations

import threading

import pytest

from inventory.models import StockItem
from orders import operations
from orders.models import Order
from orders.services import AlreadyOrdered
from shop import checkout
from tests.concurrency import Workers, wait_for_lock_waiters
from tests.orders.conftest import ADDRESS, line_requests
from tests.support.unkeyed import UnkeyedRun

pytestmark = pytest.mark.django_db(transaction=True)


def held(sku: str) -> int:
    return StockItem.objects.get(product__sku=sku).reserved


def test_a_second_order_of_a_scope_is_refused_naming_the_first_with_nothing_held(
    reserve, make_product
):
    make_product("TEE-M", stock=5)
    first = reserve({"TEE-M": 2}, scope="cart:1:3")
    assert first.scope == "cart:1:3"
    with pytest.raises(AlreadyOrdered) as refused:
        reserve({"TEE-M": 1}, scope="cart:1:3")
    assert refused.value.status == 409 and refused.value.code == "already_ordered"
    assert refused.value.extra == {"order_id": str(first.id)}
    assert Order.objects.count() == 1 and held("TEE-M") == 2

    # Another version of the cart is another scope; no scope (the API) is never refused.
    reserve({"TEE-M": 1}, scope="cart:1:4")
    reserve({"TEE-M": 1})
    reserve({"TEE-M": 1})
    assert Order.objects.count() == 4 and held("TEE-M") == 5
    assert Order.objects.filter(scope__isnull=True).count() == 2


def test_an_api_order_has_no_scope(shopper_client, make_product, provider):
    make_product("TEE-M", stock=5)
    body = {
        "lines": [{"sku": "TEE-M", "quantity": 1}],
        "on_shortage": "reject",
        "payment_method": "pm_card_ok",
        "shipping_address": ADDRESS,
    }
    response = shopper_client.post(
        "/api/v1/orders/", body, format="json", HTTP_IDEMPOTENCY_KEY="api-1"
    )
    assert response.status_code == 201, response.content
    assert Order.objects.get().scope is None


@pytest.mark.parametrize("scope", ["cart:7:2", None], ids=["scoped", "unscoped twin"])
def test_two_request_keys_racing_for_one_cart_version_make_one_order(
    shopper, make_product, provider, scope
):
    """Two placements of the same cart version under different keys (one purged and sent
    again, say), released together: the first holds its uncommitted order until the other
    is seen waiting on it. With the scope, the other is answered with the first order; the
    unscoped twin (what a request key alone guards) makes two orders."""
    make_product("TEE-M", stock=10)
    barrier = threading.Barrier(2, timeout=60)
    first = threading.Lock()
    overlap: list[int] = []

    def hold_the_first(_name: str) -> None:
        if first.acquire(blocking=False):
            overlap.append(wait_for_lock_waiters(1))

    def place():
        lines = line_requests({"TEE-M": 1})
        run = UnkeyedRun(operation=operations.CREATE)
        barrier.wait()
        operations.order_place_keyed(
            run=run,
            present=checkout.checkout_redirect,
            user=shopper,
            lines=lines,
            on_shortage="reject",
            payment_method="pm_card_ok",
            shipping_address=ADDRESS,
            scope=scope,
        )
        return run.answer

    from idempotency import failpoints

    workers = Workers()
    with failpoints.hook("checkout.reserve.after_hold", hold_the_first):
        workers.start(place)
        workers.start(place)
        answers = workers.join()
    assert overlap and overlap[0] >= 1  # the second waited on the first's transaction
    locations = {answer.headers["Location"] for answer in answers}
    orders = list(Order.objects.all())
    if scope is None:
        assert len(orders) == 2 and len(locations) == 2
        return
    assert len(orders) == 1 and locations == {f"/orders/{orders[0].id}/"}
    assert orders[0].status == "confirmed"
    assert StockItem.objects.get(product__sku="TEE-M").on_hand == 9
    assert held("TEE-M") == 0
