"""Fixtures of the storefront tests: a logged-in browser, a cart, a checkout form."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from shop.cart import cart_for
from shop.models import Cart
from tests.orders.conftest import ADDRESS, provider  # noqa: F401 (the simulator fixture)

FORM_ADDRESS = {
    "name": ADDRESS["name"],
    "line1": ADDRESS["line1"],
    "city": ADDRESS["city"],
    "postal_code": ADDRESS["postal_code"],
    "country": ADDRESS["country"],
}


@pytest.fixture
def browser(shopper) -> Client:
    """The shopper's browser: a session-logged-in test client."""
    client = Client()
    client.force_login(shopper)
    client.user = shopper
    return client


def cart_version(user) -> int:
    return Cart.objects.get(user=user).version


def add_to_cart(client: Client, sku: str, quantity: int = 1):
    """Press "Add to cart" on the product page as it is shown now (its cart version)."""
    cart = cart_for(user=client.user)
    response = client.post(
        f"/products/{sku}/", {"quantity": str(quantity), "cart_version": str(cart.version)}
    )
    assert response.status_code == 303, response.content
    return response


def checkout_form(client: Client, **fields) -> dict:
    """The checkout page's form as a browser would send it (its key and total included)."""
    page = client.get("/checkout/")
    assert page.status_code == 200, page
    html = page.content.decode()
    data = {
        "idempotency_key": re.search(r'name="idempotency_key" value="([^"]+)"', html)[1],
        "expected_total": re.search(r'name="expected_total" value="([^"]+)"', html)[1],
        **FORM_ADDRESS,
        "payment_method": "pm_card_ok",
        "on_shortage": "reject",
    }
    data.update(fields)
    return data


def order_id_of(response) -> str:
    match = re.fullmatch(r"/orders/([0-9a-f-]{36})/", response["Location"])
    assert match, response["Location"]
    return match[1]
