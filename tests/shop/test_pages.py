"""Storefront pages: each renders for its user with the contract's names, CSRF, 404, one host."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from orders import shipments, tracking
from orders.models import Order
from shop.models import CartLine
from tests.orders.conftest import line_requests

from .conftest import FORM_ADDRESS, add_to_cart, cart_version, checkout_form, order_id_of

pytestmark = pytest.mark.django_db(transaction=True)

User = get_user_model()


@pytest.fixture
def catalog(make_product):
    make_product("TEE-M", price="19.99", stock=8, name="T-shirt, size M")
    make_product("SOCKS", price="7.00", stock=0, name="Socks")


def names_in(html: str, *names: str) -> None:
    for name in names:
        assert re.search(rf">\s*{re.escape(name)}\s*<", html), f"{name!r} not found"


def label_for(html: str, text: str) -> str:
    """The id of the control whose <label> reads `text` (labels tied to fields)."""
    match = re.search(rf'<label for="([^"]+)">{re.escape(text)}</label>', html)
    assert match, f"no label {text!r}"
    assert f'id="{match[1]}"' in html, f"label {text!r} points at nothing"
    return match[1]


def assert_one_host(html: str) -> None:
    """Nothing is loaded from, or linked to, another host."""
    for attribute, url in re.findall(r'(src|href|action)="([^"]*)"', html):
        assert not re.match(r"(https?:)?//", url), (attribute, url)


def test_the_catalog_shows_availability_to_anyone(client, catalog):
    response = client.get("/")
    assert response.status_code == 200
    html = response.content.decode()
    assert '<html lang="en">' in html and 'href="#main"' in html and '<main id="main"' in html
    assert "In stock (8 available)" in html and "Sold out" in html
    names_in(html, "Log in", "Sign up")
    assert_one_host(html)


def test_the_product_page_has_quantity_and_add_to_cart(client, catalog):
    html = client.get("/products/TEE-M/").content.decode()
    assert label_for(html, "Quantity") == "id_quantity"
    names_in(html, "Add to cart")
    assert client.get("/products/NOPE/").status_code == 404


def test_adding_without_an_account_keeps_the_item_in_the_session_cart(client, catalog):
    response = client.post("/products/TEE-M/", {"quantity": "2", "cart_version": "0"})
    assert response.status_code == 303 and response["Location"] == "/cart/"
    html = client.get("/cart/").content.decode()
    assert "T-shirt, size M" in html and "Go to checkout" in html
    assert "log in or sign up" in html
    assert not CartLine.objects.exists()  # not in any shopper's cart until log-in


def test_the_cart_changes_quantities_and_removes_lines(browser, catalog):
    add_to_cart(browser, "TEE-M", 1)
    add_to_cart(browser, "TEE-M", 2)
    assert CartLine.objects.get().quantity == 3
    html = browser.get("/cart/").content.decode()
    assert "Quantity" in html and "Remove" in html and "Go to checkout" in html
    version = cart_version(browser.user)
    changed = browser.post(
        "/cart/", {"cart_version": version, "sku": "TEE-M", "quantity": "4", "action": "update"}
    )
    assert changed.status_code == 303 and CartLine.objects.get().quantity == 4
    # The same form again (a double click): the version moved on, nothing changes twice.
    stale = browser.post(
        "/cart/", {"cart_version": version, "sku": "TEE-M", "quantity": "4", "action": "remove"}
    )
    assert stale.status_code == 303 and CartLine.objects.get().quantity == 4
    assert "Your cart changed" in browser.get("/cart/").content.decode()
    removed = browser.post(
        "/cart/",
        {"cart_version": cart_version(browser.user), "sku": "TEE-M", "action": "remove"},
    )
    assert removed.status_code == 303 and not CartLine.objects.exists()


def test_a_double_click_on_add_to_cart_adds_once(browser, catalog):
    add_to_cart(browser, "TEE-M", 1)
    version = cart_version(browser.user)
    form = {"quantity": "1", "cart_version": str(version)}
    assert browser.post("/products/TEE-M/", form).status_code == 303
    assert browser.post("/products/TEE-M/", form).status_code == 303
    assert CartLine.objects.get().quantity == 2


def test_the_checkout_page_has_every_named_field(browser, catalog):
    add_to_cart(browser, "TEE-M", 1)
    html = browser.get("/checkout/").content.decode()
    for label in ("Name", "Address", "City", "Postal code", "Country", "Payment method"):
        label_for(html, label)
    assert label_for(html, "If some items are short") == "id_on_shortage"
    for method in ("pm_card_ok", "pm_card_declined", "pm_card_timeout", "pm_card_unavailable"):
        assert f'value="{method}"' in html
    for mode in ("reject", "partial", "ask"):
        assert f'value="{mode}"' in html
    names_in(html, "Place order")
    assert '<select name="country"' in html
    assert '<option value="GB">United Kingdom</option>' in html
    assert '<option value="DE">Germany</option>' in html
    assert_one_host(html)


def test_an_empty_cart_has_no_checkout(browser):
    response = browser.get("/checkout/")
    assert response.status_code == 303 and response["Location"] == "/cart/"


def test_pages_need_an_account(client):
    for path in ("/checkout/", "/orders/", "/account/", "/accounts/password-change/"):
        response = client.get(path)
        assert response.status_code == 302
        assert response["Location"] == f"/accounts/login/?next={path}"


def test_the_orders_pages_render_and_another_shoppers_order_is_not_found(
    browser, catalog, provider, make_user
):
    add_to_cart(browser, "TEE-M", 2)
    order_id = order_id_of(browser.post("/checkout/", checkout_form(browser)))
    order = Order.objects.get(id=order_id)
    listing = browser.get("/orders/").content.decode()
    assert f"Order {order.number}" in listing and "Confirmed" in listing
    page = browser.get(f"/orders/{order_id}/").content.decode()
    assert f"Order {order.number}" in page and "Captured" in page and "Refunds" in page
    assert_one_host(page)

    stranger = Client()
    stranger.force_login(make_user())
    for path in (f"/orders/{order_id}/", f"/orders/{order_id}/return/"):
        assert stranger.get(path).status_code == 404
    staff = Client()
    staff.force_login(make_user(staff=True))  # the storefront shows staff their own only
    assert staff.get(f"/orders/{order_id}/").status_code == 404
    assert browser.get("/orders/not-an-id/").status_code == 404


def test_a_shipped_order_shows_its_tracking_once_per_event(browser, catalog, provider, shopper):
    add_to_cart(browser, "TEE-M", 1)
    order = Order.objects.get(id=order_id_of(browser.post("/checkout/", checkout_form(browser))))
    shipment = shipments.shipment_create(
        order_id=order.id, lines=None, carrier="DemoPost", tracking_number="DP123"
    )
    event = {
        "event_id": "ev-1",
        "status": "picked_up",
        "occurred_at": "2026-12-01T09:00:00Z",
        "location": "Berlin",
    }
    for _ in range(2):  # the courier sends it twice
        tracking.tracking_event_record(
            shipment=shipment,
            event_id="ev-1",
            status="picked_up",
            occurred_at=datetime(2026, 12, 1, 9, tzinfo=UTC),
            location="Berlin",
            payload=event,
            raw_body="{}",
        )
    html = browser.get(f"/orders/{order.id}/").content.decode()
    assert html.count("Picked up, Berlin") == 1
    assert "1 repeated report" in html and "DemoPost" in html and "Shipped" in html

    form_page = browser.get(f"/orders/{order.id}/return/").content.decode()
    names_in(form_page, "Request return")
    label_for(form_page, "Quantity")
    assert "not available yet" not in form_page  # the form is real (tests/shop/test_returns.py)


def test_signup_logs_in_and_login_logout_work(client, catalog):
    page = client.get("/accounts/signup/").content.decode()
    for label in ("Username", "Email", "Password"):
        label_for(page, label)
    names_in(page, "Sign up")
    weak = client.post(
        "/accounts/signup/", {"username": "ada", "email": "ada@example.com", "password": "123"}
    )
    assert weak.status_code == 400
    assert 'id="id_password_error"' in weak.content.decode()
    assert 'aria-invalid="true"' in weak.content.decode()
    response = client.post(
        "/accounts/signup/",
        {"username": "ada", "email": "ada@example.com", "password": "correct horse battery"},
    )
    assert response.status_code == 303
    assert client.get("/account/").status_code == 200
    taken = Client().post(
        "/accounts/signup/",
        {"username": "ada", "email": "a@example.com", "password": "correct horse battery"},
    )
    assert "This username is taken" in taken.content.decode()

    logout_page = client.get("/accounts/logout/").content.decode()
    assert logout_page.count(">Log out</button>") == 1
    assert client.post("/accounts/logout/").status_code == 303
    assert client.get("/account/").status_code == 302

    login_page = client.get("/accounts/login/").content.decode()
    label_for(login_page, "Username")
    label_for(login_page, "Password")
    names_in(login_page, "Log in")
    bad = client.post("/accounts/login/", {"username": "ada", "password": "wrong"})
    assert bad.status_code == 200 and 'role="alert"' in bad.content.decode()
    good = client.post("/accounts/login/", {"username": "ada", "password": "correct horse battery"})
    assert good.status_code == 303 and good["Location"] == "/"


def test_the_account_page_shows_points_history_and_deletes(browser, catalog, shopper):
    html = browser.get("/account/").content.decode()
    assert "Loyalty points" in html and "Purchase history" in html
    names_in(html, "Delete account")
    not_ticked = browser.post("/account/delete/", {})
    assert not_ticked.status_code == 303 and User.objects.get(id=shopper.id).is_active
    deleted = browser.post("/account/delete/", {"confirm": "yes"})
    assert deleted.status_code == 303
    assert not User.objects.get(id=shopper.id).is_active
    assert browser.get("/account/").status_code == 302


def test_every_storefront_form_refuses_a_post_without_its_csrf_token(shopper, catalog):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(shopper)
    forms = {
        "/products/TEE-M/": {"quantity": "1", "cart_version": "0"},
        "/cart/": {"cart_version": "0", "sku": "TEE-M", "action": "remove"},
        "/checkout/": {**FORM_ADDRESS, "payment_method": "pm_card_ok", "on_shortage": "reject"},
        "/account/delete/": {"confirm": "yes"},
        "/account/logout-everywhere/": {},
        "/accounts/logout/": {},
        "/accounts/signup/": {"username": "x", "email": "x@example.com", "password": "pw"},
        "/accounts/login/": {"username": "x", "password": "pw"},
    }
    for path, data in forms.items():
        response = browser.post(path, data)
        assert response.status_code == 403, path
    assert not CartLine.objects.exists()
    assert User.objects.get(id=shopper.id).is_active


def test_the_decision_page_forms_refuse_a_post_without_csrf(shopper, catalog, reserve_ask):
    order = reserve_ask
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(shopper)
    for action in ("confirm", "cancel"):
        response = browser.post(f"/orders/{order.id}/{action}/", {"idempotency_key": "k"})
        assert response.status_code == 403
    order.refresh_from_db()
    assert order.status == "awaiting_decision"


def test_the_decision_page_without_javascript(browser, catalog, reserve_ask):
    html = browser.get(f"/orders/{reserve_ask.id}/").content.decode()
    names_in(html, "Confirm available items", "Cancel order")
    assert "Waiting for your decision" in html
    assert re.search(r"\d\d:\d\d:\d\d UTC</time>", html)
    assert_one_host(html)


@pytest.fixture
def reserve_ask(shopper, catalog):
    from orders.services import order_hold
    from tests.orders.conftest import ADDRESS

    return order_hold(
        owner=shopper,
        lines=line_requests({"TEE-M": 1, "SOCKS": 1}),
        on_shortage="ask",
        payment_method="pm_card_ok",
        shipping_address=ADDRESS,
    )


def test_static_files_are_served_from_this_host(client):
    for path in ("/static/shop/css/shop.css", "/static/shop/js/shop.js"):
        response = client.get(path)
        assert response.status_code == 200, path
