"""The checkout form past a shopper's limits (docs/checkout.md, "Limits per shopper").

The storefront places orders through the same service as the API, so the
same limits apply; the refusal is a page (429 with `Retry-After`), the cart
keeps its lines and version, and nothing is held or stored.
"""

from __future__ import annotations

import pytest

from idempotency.models import IdempotencyKey
from inventory.models import StockItem
from orders.models import Order
from orders.services import order_hold
from shop.models import CartLine
from tests.orders.conftest import ADDRESS, line_requests

from .conftest import add_to_cart, cart_version, checkout_form

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "limit", [{"ORDER_HOLDING_MAX": 1}, {"ORDER_PLACE_PER_MINUTE": 1}], ids=["holding", "rate"]
)
def test_the_checkout_past_a_limit_shows_a_refusal_and_holds_nothing(
    browser, make_product, settings, limit
):
    for name, value in limit.items():
        setattr(settings, name, value)
    make_product("TEE-M", price="19.99", stock=10, name="T-shirt, size M")
    make_product("CAP", price="12.00", stock=0)
    # An `ask` order awaiting the shopper's decision: one held, one placed this minute.
    order_hold(
        owner=browser.user,
        lines=line_requests({"TEE-M": 2, "CAP": 1}),
        on_shortage="ask",
        payment_method="pm_card_ok",
        shipping_address=ADDRESS,
    )
    add_to_cart(browser, "TEE-M", 3)
    add_to_cart(browser, "CAP", 1)
    version = cart_version(browser.user)
    form = checkout_form(browser, on_shortage="ask")  # would await the decision: no payment

    response = browser.post("/checkout/", form)
    assert response.status_code == 429, response.content[:500]
    assert int(response["Retry-After"]) >= 1
    html = response.content.decode()
    assert "Nothing was held" in html and 'href="/orders/"' in html
    assert StockItem.objects.get(product__sku="TEE-M").reserved == 2
    assert Order.objects.count() == 1
    assert not IdempotencyKey.objects.filter(key=form["idempotency_key"]).exists()
    # The cart is as it was: the same key places it once the limit allows.
    assert cart_version(browser.user) == version
    assert dict(CartLine.objects.values_list("sku", "quantity")) == {"TEE-M": 3, "CAP": 1}
