"""The checkout form past a shopper's limits (docs/checkout.md, "Limits per shopper").

The storefront places orders through the same service as the API, so the
same limits apply; the refusal is a page (429 with `Retry-After`), the cart
keeps its lines and version, and nothing is held or stored.
"""

from __future__ import annotations

import re

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


def _awaiting_orders(owner, count: int) -> None:
    """`count` orders awaiting the shopper's decision (shirts held, the cap short)."""
    for _ in range(count):
        order_hold(
            owner=owner,
            lines=line_requests({"TEE-M": 2, "CAP": 1}),
            on_shortage="ask",
            payment_method="pm_card_ok",
            shipping_address=ADDRESS,
        )


def _french_refusal(browser, django_settings) -> str:
    """Place the cart from the French storefront: refused (429), the page's text."""
    browser.cookies.load({django_settings.LANGUAGE_COOKIE_NAME: "fr"})
    add_to_cart(browser, "TEE-M", 1)
    response = browser.post("/checkout/", checkout_form(browser, on_shortage="ask"))
    assert response.status_code == 429, response.content[:500]
    html = response.content.decode()
    assert "Rien n&#x27;a été réservé ni débité pour cette commande." in html
    assert "Nothing was held" not in html
    return html


@pytest.mark.parametrize(
    ("most", "french"),
    [
        (1, "Vous avez 1 commande en attente de votre décision"),
        (2, "Vous avez 2 commandes en attente de votre décision"),
    ],
    ids=["one", "two"],
)
def test_the_holding_refusal_reads_in_french_with_its_plural_and_the_api_in_english(
    browser, shopper_client, make_product, settings, most, french
):
    settings.ORDER_HOLDING_MAX = most
    make_product("TEE-M", price="19.99", stock=10)
    make_product("CAP", price="12.00", stock=0)
    _awaiting_orders(browser.user, most)

    assert french in _french_refusal(browser, settings)

    # The API asked in French answers in English, byte for byte as when asked in English.
    body = {
        "lines": [{"sku": "TEE-M", "quantity": 1}],
        "on_shortage": "ask",
        "payment_method": "pm_card_ok",
        "shipping_address": ADDRESS,
    }
    answers = [
        shopper_client.post(
            "/api/v1/orders/",
            body,
            format="json",
            HTTP_IDEMPOTENCY_KEY=f"limit-{language}",
            HTTP_ACCEPT_LANGUAGE=language,
        )
        for language in ("fr", "en")
    ]
    assert answers[0].status_code == answers[1].status_code == 429, answers[0].content
    assert answers[0].content == answers[1].content
    noun = "order" if most == 1 else "orders"
    english = f"You have {most} {noun} awaiting your decision or a payment outcome (at most {most})"
    assert answers[0].json()["detail"].startswith(english)


def test_the_rate_refusal_reads_in_french_with_each_plural(browser, make_product, settings):
    settings.ORDER_PLACE_PER_MINUTE = 1
    make_product("TEE-M", price="19.99", stock=10)
    make_product("CAP", price="12.00", stock=0)
    _awaiting_orders(browser.user, 1)  # placed just now: about a minute to wait

    html = _french_refusal(browser, settings)
    assert "Vous avez passé 1 commande dans la dernière minute (au plus 1) : attendez " in html
    assert re.search(r"attendez \d\d secondes avant d&#x27;en passer une autre\.", html), html
