"""The checkout form: the API's keyed operation under `checkout:<cart>:<version>`, PRG answers."""

from __future__ import annotations

import pytest
from django.test import Client

from idempotency.models import IdempotencyKey
from idempotency.views import REPLAYED_HEADER
from inventory.models import StockItem
from orders.models import Order
from shop import checkout
from shop.models import Cart, CartLine
from tests.support.simulator import settle_due

from .conftest import add_to_cart, cart_version, checkout_form, order_id_of

pytestmark = pytest.mark.django_db(transaction=True)


def charges(provider, order):
    return [
        op
        for op in provider.ledger()
        if op["kind"] == "capture"
        and op["status"] == "succeeded"
        and op["key"].endswith(f":order-{order.number}:capture")
    ]


@pytest.fixture
def catalog(make_product):
    make_product("TEE-M", price="19.99", stock=5, name="T-shirt, size M")
    make_product("MUG", price="12.50", stock=1, name="Enamel mug")


def test_the_form_sent_twice_is_one_order_one_charge_and_the_same_redirect(
    browser, catalog, provider
):
    add_to_cart(browser, "TEE-M", 2)
    version = cart_version(browser.user)
    form = checkout_form(browser)
    cart = Cart.objects.get(user=browser.user)
    assert form["idempotency_key"] == f"checkout:{cart.id}:{version}"
    assert form["expected_total"] == "39.98"

    first = browser.post("/checkout/", form)
    assert first.status_code == 303
    order = Order.objects.get()
    assert first["Location"] == f"/orders/{order.id}/"
    assert order.status == "confirmed"

    again = browser.post("/checkout/", form)  # double click, refresh, second tab
    assert again.status_code == 303 and again["Location"] == first["Location"]
    assert again[REPLAYED_HEADER] == "true"
    assert Order.objects.count() == 1 and len(charges(provider, order)) == 1
    assert StockItem.objects.get(product__sku="TEE-M").on_hand == 3

    # The order emptied the cart, once; the cart moved on to a new version.
    assert not CartLine.objects.exists()
    assert cart_version(browser.user) == version + 1
    page = browser.get(first["Location"])
    assert page.status_code == 200
    html = page.content.decode()
    assert f"Order {order.number}" in html and "Confirmed" in html


def test_a_second_tab_with_the_same_cart_lands_on_the_same_order(browser, catalog, provider):
    add_to_cart(browser, "TEE-M", 1)
    form = checkout_form(browser)
    other_tab = Client()
    other_tab.force_login(browser.user)
    first = browser.post("/checkout/", form)
    second = other_tab.post("/checkout/", form)
    assert second.status_code == 303 and second["Location"] == first["Location"]
    assert Order.objects.count() == 1


def test_a_declined_card_then_another_method_is_one_confirmed_order(browser, catalog, provider):
    add_to_cart(browser, "TEE-M", 2)
    version = cart_version(browser.user)
    declined_form = checkout_form(browser, payment_method="pm_card_declined")
    declined = browser.post("/checkout/", declined_form)
    assert declined.status_code == 303
    declined_id = order_id_of(declined)
    assert Order.objects.get(id=declined_id).status == "payment_failed"

    # The decline is final for that attempt: the cart keeps its lines, moves on.
    assert cart_version(browser.user) == version + 1
    assert CartLine.objects.get().quantity == 2
    page = browser.get(declined["Location"])
    html = page.content.decode()
    assert "Payment declined" in html and 'href="/checkout/"' in html

    retry_form = checkout_form(browser, payment_method="pm_card_ok")
    assert retry_form["idempotency_key"] != declined_form["idempotency_key"]
    retried = browser.post("/checkout/", retry_form)
    confirmed_id = order_id_of(retried)
    assert confirmed_id != declined_id
    assert Order.objects.get(id=confirmed_id).status == "confirmed"
    assert not CartLine.objects.exists()

    # "Resubmit the form?" on the declined page: the stored redirect, the same decline.
    resubmitted = browser.post("/checkout/", declined_form)
    assert resubmitted["Location"] == declined["Location"]
    assert resubmitted[REPLAYED_HEADER] == "true"
    assert "Payment declined" in browser.get(declined["Location"]).content.decode()
    assert list(Order.objects.values_list("status", flat=True).order_by("number")) == [
        "payment_failed",
        "confirmed",
    ]
    confirmed = Order.objects.get(id=confirmed_id)
    assert len(charges(provider, confirmed)) == 1


def test_out_of_stock_shows_what_is_available_and_a_new_attempt_is_possible(
    browser, catalog, provider
):
    add_to_cart(browser, "MUG", 3)
    version = cart_version(browser.user)
    response = browser.post("/checkout/", checkout_form(browser))
    assert response.status_code == 303
    assert response["Location"] == "/checkout/?problem=insufficient_stock"
    assert not Order.objects.exists()
    assert cart_version(browser.user) == version + 1  # the refusal ended that attempt

    page = browser.get(response["Location"]).content.decode()
    assert "Some items are not in stock" in page
    assert "Enamel mug: you asked for 3, 1 available." in page

    # Sending what is available is a new attempt (a new key), not the stored refusal.
    partial = browser.post("/checkout/", checkout_form(browser, on_shortage="partial"))
    order = Order.objects.get(id=order_id_of(partial))
    assert order.status == "partially_confirmed"


def test_a_changed_price_is_a_message_and_nothing_is_reserved(browser, catalog, provider):
    add_to_cart(browser, "TEE-M", 1)
    form = checkout_form(browser, expected_total="9.99")
    response = browser.post("/checkout/", form)
    assert response["Location"] == "/checkout/?problem=price_changed"
    assert not Order.objects.exists()
    page = browser.get(response["Location"]).content.decode()
    assert "Prices changed" in page and "€19.99" in page


def test_a_form_of_an_older_cart_version_places_nothing(browser, catalog, provider):
    add_to_cart(browser, "TEE-M", 1)
    form = checkout_form(browser)
    add_to_cart(browser, "MUG", 1)  # the cart moved on; the form shows the old one
    response = browser.post("/checkout/", form)
    assert response.status_code == 409
    assert "Your cart changed" in response.content.decode()
    assert not Order.objects.exists() and not IdempotencyKey.objects.exists()


def test_an_invalid_form_is_shown_again_with_its_errors_linked(browser, catalog, provider):
    add_to_cart(browser, "TEE-M", 1)
    response = browser.post("/checkout/", checkout_form(browser, country="Germany", name=""))
    assert response.status_code == 400
    html = response.content.decode()
    assert 'aria-describedby="id_country_error"' in html
    assert 'id="id_country_error"' in html and 'id="id_name_error"' in html
    assert not IdempotencyKey.objects.exists()


def test_ask_mode_decision_confirm_available_items(browser, catalog, provider):
    add_to_cart(browser, "TEE-M", 1)
    add_to_cart(browser, "MUG", 2)
    response = browser.post("/checkout/", checkout_form(browser, on_shortage="ask"))
    order = Order.objects.get(id=order_id_of(response))
    assert order.status == "awaiting_decision"
    assert CartLine.objects.count() == 2  # undecided: the cart waits

    page = browser.get(response["Location"]).content.decode()
    assert "Confirm available items" in page and "Cancel order" in page
    assert "data-countdown=" in page and "UTC" in page  # the time, server-rendered
    key = checkout_form_key(page, "/confirm/")
    confirmed = browser.post(f"/orders/{order.id}/confirm/", {"idempotency_key": key})
    assert confirmed.status_code == 303 and confirmed["Location"] == f"/orders/{order.id}/"
    again = browser.post(f"/orders/{order.id}/confirm/", {"idempotency_key": key})
    assert again[REPLAYED_HEADER] == "true"
    order.refresh_from_db()
    assert order.status == "partially_confirmed"
    assert len(charges(provider, order)) == 1
    assert not CartLine.objects.exists()


def test_ask_mode_cancel_keeps_the_cart_for_another_attempt(browser, catalog, provider):
    add_to_cart(browser, "MUG", 2)
    version = cart_version(browser.user)
    response = browser.post("/checkout/", checkout_form(browser, on_shortage="ask"))
    order_id = order_id_of(response)
    page = browser.get(response["Location"]).content.decode()
    cancelled = browser.post(
        f"/orders/{order_id}/cancel/", {"idempotency_key": checkout_form_key(page, "/cancel/")}
    )
    assert cancelled["Location"] == f"/orders/{order_id}/"
    assert Order.objects.get(id=order_id).status == "cancelled"
    assert "Cancelled" in browser.get(cancelled["Location"]).content.decode()
    assert CartLine.objects.get().quantity == 2 and cart_version(browser.user) == version + 1


def test_a_pending_payment_page_polls_and_the_cart_empties_once_it_settles(
    browser, catalog, provider
):
    add_to_cart(browser, "TEE-M", 1)
    response = browser.post("/checkout/", checkout_form(browser, payment_method="pm_card_timeout"))
    order = Order.objects.get(id=order_id_of(response))
    assert order.status == "payment_pending"
    page = browser.get(response["Location"]).content.decode()
    assert "Payment pending" in page and "refresh this page" in page
    assert (
        f'hx-get="/orders/{order.id}/status/?shown=payment_pending"' in page
        and 'hx-trigger="every 2s"' in page
    )
    assert "/static/shop/vendor/htmx.min.js" in page
    assert CartLine.objects.exists()
    fragment = browser.get(f"/orders/{order.id}/status/")
    assert fragment.status_code == 200 and "HX-Refresh" not in fragment

    settle_due(order.payment)
    settled = browser.get(f"/orders/{order.id}/status/")
    assert settled["HX-Refresh"] == "true" and "Confirmed" in settled.content.decode()
    assert not CartLine.objects.exists()


def checkout_form_key(html: str, action: str) -> str:
    import re

    form = re.search(rf'action="[^"]*{action}".*?</form>', html, re.S)[0]
    return re.search(r'name="idempotency_key" value="([^"]+)"', form)[1]


def test_the_forms_operation_names_are_registered_with_redirecting_presenters():
    from idempotency.keys import registered_presenter

    assert registered_presenter(checkout.CREATE) is checkout.checkout_redirect
    assert registered_presenter(checkout.CONFIRM) is checkout.decision_redirect
    assert registered_presenter(checkout.CANCEL) is checkout.decision_redirect


def test_the_country_is_chosen_from_the_iso_list(browser, catalog, provider):
    add_to_cart(browser, "TEE-M", 1)
    unknown = browser.post("/checkout/", checkout_form(browser, country="XX"))
    assert unknown.status_code == 400
    assert "Choose a country from the list" in unknown.content.decode()
    assert not Order.objects.exists()
    placed = browser.post("/checkout/", checkout_form(browser, country=" gb "))
    order = Order.objects.get(id=order_id_of(placed))
    assert order.shipping_address["country"] == "GB"
    assert "United Kingdom" in browser.get(placed["Location"]).content.decode()
