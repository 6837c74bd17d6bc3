"""Two submits of one checkout form: the second read the cart before the first kept its
order and its lines after (docs/checkout.md, "One order per cart version")."""

from __future__ import annotations

import copy

import pytest

from idempotency.views import KeyRequest
from orders.models import Order
from shop import cart as carts
from shop.views import catalog as catalog_views

from .conftest import add_to_cart, checkout_form, order_id_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def catalog(make_product):
    make_product("MUG", price="8.50", stock=5, name="Enamel mug")


def test_a_submit_that_read_the_cart_before_the_order_emptied_it_answers_that_order(
    browser, catalog, provider, monkeypatch
):
    add_to_cart(browser, "MUG", 2)
    form = checkout_form(browser)
    stale = copy.copy(carts.cart_for(user=browser.user))  # the second submit's read
    first = browser.post("/checkout/", form)
    assert first.status_code == 303

    # The second submit of the same form looked its key up and read the cart (its
    # version) while the first still ran; it reads the lines now, after the first kept
    # its order and emptied them.
    monkeypatch.setattr(KeyRequest, "stored_answer", lambda self: None)
    monkeypatch.setattr(catalog_views.carts, "cart_for", lambda *, user: stale)
    second = browser.post("/checkout/", form)

    assert second.status_code == 303
    assert second["Location"] == first["Location"]
    assert Order.objects.filter(id=order_id_of(second)).count() == 1
    assert Order.objects.count() == 1
