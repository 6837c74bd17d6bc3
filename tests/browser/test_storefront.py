"""The storefront in a real browser: exactly one order and one charge, whatever the shopper does.

Every control is found by the accessible name the contract gives it
("Storefront" in the HTTP contract). The shop is real: gunicorn on the test
database, the payment simulator, a Celery worker with beat (tests/browser/
conftest.py). Each order's charges are read from the simulator's ledger.
"""

from __future__ import annotations

import re
import threading
import time
from decimal import Decimal

import pytest
import requests
from django.test import Client
from playwright.sync_api import Error as PlaywrightError

from idempotency.keys import FINISHED, key_lookup
from inventory.models import Reservation, StockItem
from orders.models import Order
from shop.words import FORM_REFUSALS
from tests.browser import ui
from tests.support.servers import gunicorn_server, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ADDRESS = {
    "Name": "Ada Lovelace",
    "Address": "1 Analytical Way",
    "City": "London",
    "Postal code": "N1 9GU",
    "Country": "GB",
}
ORDER_URL = re.compile(r"/orders/(?P<id>[0-9a-f-]{36})/$")
# The order page's status "in words" (never the API's snake_case code).
STATUS_WORDS = {
    "confirmed": re.compile(r"(?<!partially )confirmed", re.I),
    "partially_confirmed": re.compile(r"partially confirmed", re.I),
    "awaiting_decision": re.compile(r"awaiting|your decision", re.I),
    "payment_pending": re.compile(r"pending", re.I),
    "payment_failed": re.compile(r"payment failed|declined", re.I),
    "expired": re.compile(r"expired", re.I),
    "cancelling": re.compile(r"being cancelled", re.I),
    "cancelled": re.compile(r"cancelled", re.I),
}


@pytest.fixture(scope="module", autouse=True)
def _storefront_built():
    """Skip (saying why) while the storefront's pages are not in this tree."""
    from django.urls import Resolver404, resolve

    try:
        resolve("/checkout/")
    except Resolver404:
        pytest.skip("the storefront pages (/checkout/ ...) are not built yet (branch `pages`)")


# --- Steps ---------------------------------------------------------------------


def add_to_cart(page, sku: str, quantity: int = 1) -> None:
    ui.visit(page, f"/products/{sku}/")
    page.get_by_label("Quantity", exact=True).fill(str(quantity))
    page.get_by_role("button", name="Add to cart").click()
    page.wait_for_load_state()


def fill_checkout(
    page, *, payment_method: str = "pm_card_ok", on_shortage: str | None = None
) -> None:
    """Open /checkout/ and fill the form (nothing submitted)."""
    ui.visit(page, "/checkout/")
    for label, value in ADDRESS.items():
        ui.fill_field(page.get_by_label(label, exact=True), value)
    ui.fill_field(page.get_by_label("Payment method", exact=True), payment_method)
    if on_shortage is not None:
        ui.fill_field(page.get_by_label("If some items are short", exact=True), on_shortage)


def place_order_button(page):
    return page.get_by_role("button", name="Place order")


def place_order(page) -> Order:
    """Click "Place order" once, wait for /orders/{id}/; return the order."""
    place_order_button(page).click()
    page.wait_for_url(ORDER_URL)
    return order_on(page)


def order_on(page) -> Order:
    match = ORDER_URL.search(page.url)
    assert match, f"not on an order page: {page.url}"
    return Order.objects.get(id=match["id"])


def assert_order_shown(page, order: Order) -> None:
    """The order page shows the order's number and its current status in words."""
    order.refresh_from_db()
    assert ORDER_URL.search(page.url) and ORDER_URL.search(page.url)["id"] == str(order.id)
    text = page.locator("body").inner_text()
    assert str(order.number) in text, f"order number {order.number} not on the page:\n{text}"
    assert STATUS_WORDS[order.status].search(text), (
        f"status {order.status!r} not shown in words:\n{text}"
    )
    if "_" in order.status:
        assert order.status not in text, f"the raw code {order.status!r} is shown, not words"


def held(sku: str) -> int:
    return StockItem.objects.get(product__sku=sku).reserved


def assert_one_order_one_charge(shop, owner_username: str) -> Order:
    orders = list(Order.objects.filter(owner__username=owner_username))
    assert len(orders) == 1, [(o.number, o.status) for o in orders]
    order = orders[0]
    charges = shop.charges(order.number)
    assert len(charges) == 1, charges
    return order


# --- The happy path and every page ----------------------------------------------


def test_every_page_accessible_and_served_from_the_shop_alone(shop, page, make_product):
    """Sign up, add to cart, check out: each storefront page at two widths, axe-clean,
    and every request the browser makes goes to the live server's own origin."""
    from orders.shipments import shipment_create

    make_product("TEE-M", price="19.99", stock=5, name="T-shirt, medium")
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))

    ui.visit(page, "/accounts/signup/")
    ui.check_page(page, "signup")
    username = ui.signup(page)

    ui.visit(page, "/")
    assert page.get_by_text("T-shirt, medium").count()
    ui.check_page(page, "catalog")
    ui.visit(page, "/products/TEE-M/")
    ui.check_page(page, "product")
    add_to_cart(page, "TEE-M", 2)
    ui.visit(page, "/cart/")
    ui.check_page(page, "cart")
    fill_checkout(page)
    ui.check_page(page, "checkout")
    order = place_order(page)
    assert order.status == "confirmed"
    assert_order_shown(page, order)
    ui.check_page(page, "order")
    assert_one_order_one_charge(shop, username)
    assert held("TEE-M") == 0

    ui.visit(page, "/orders/")
    assert page.get_by_text(str(order.number)).count()
    ui.check_page(page, "orders")
    # The return form lists returnable (shipped) units: ship the order first.
    shipment_create(order_id=order.id, lines=None, carrier="dhl", tracking_number="T1")
    ui.visit(page, f"/orders/{order.id}/return/")
    ui.check_page(page, "order-return")
    ui.visit(page, "/account/")
    ui.check_page(page, "account")
    page.get_by_role("button", name="Log out", exact=True).click()
    page.wait_for_load_state()
    ui.visit(page, "/accounts/login/")
    ui.check_page(page, "login")

    assert requested, "the page listener saw no request"
    foreign = [url for url in requested if ui.origin_of(url) != ui.origin_of(shop.url)]
    assert not foreign, f"requests to another host: {foreign}"


# --- Double submits ---------------------------------------------------------------


def test_double_click_on_place_order_makes_one_order_and_one_charge(shop, page, make_product):
    make_product("MUG", price="8.50", stock=5)
    username = ui.signup(page)
    add_to_cart(page, "MUG", 1)
    fill_checkout(page)
    place_order_button(page).dblclick()
    page.wait_for_url(ORDER_URL)
    page.wait_for_load_state()
    order = assert_one_order_one_charge(shop, username)
    assert order.status == "confirmed"
    assert_order_shown(page, order)
    assert StockItem.objects.get(product__sku="MUG").on_hand == 4


def land_on_the_order(page, *, username: str, key: str) -> None:
    """Wait for the order page after "Place order" was sent twice without script.

    The browser aborts its first POST when the second click sends the form
    again; when the first has already reached the shop, the second meets its
    key still running and the answer is the page saying the form is being sent
    already (409, docs/idempotency.md). The shopper reloads it once the first
    has finished: the same POST, the same key, answered with the first one's
    303 to the order.
    """
    in_use = page.get_by_text(str(FORM_REFUSALS["idempotency_key_in_use"]))
    order_heading = page.get_by_role("heading", name=re.compile(r"^Order \d+$"))
    order_heading.or_(in_use).wait_for()
    if in_use.count():
        owner = Order.objects.get(owner__username=username).owner_id
        wait_until(
            lambda: (
                getattr(key_lookup(owner_id=owner, key=key), "recovery_point", None) == FINISHED
            ),
            message=f"the first submission under {key} finished",
        )
        page.reload()
    page.wait_for_url(ORDER_URL)


def rendered_form(page):
    """The checkout form's action and fields as the browser would send them now."""
    form = place_order_button(page).locator("xpath=ancestor::form")
    return form.evaluate("f => f.action"), form.evaluate(
        "f => Array.from(new FormData(f).entries())"
    )


def test_without_javascript_double_click_back_and_submit_again_make_one_order(
    shop, new_context, make_product
):
    """No script: a double click, back, and the same rendered form submitted once more."""
    make_product("MUG", price="8.50", stock=5)
    page = new_context(shop, java_script_enabled=False).new_page()
    username = ui.signup(page)
    add_to_cart(page, "MUG", 1)
    fill_checkout(page)
    action, data = rendered_form(page)
    place_order_button(page).dblclick()
    land_on_the_order(page, username=username, key=dict(data)["idempotency_key"])
    order = assert_one_order_one_charge(shop, username)
    assert_order_shown(page, order)

    page.go_back()
    page.wait_for_load_state()
    if place_order_button(page).count():  # the checkout page again, still filled
        place_order_button(page).click()
        page.wait_for_url(ORDER_URL)
        assert order_on(page).id == order.id
    # The form as first rendered (its key, its CSRF token), submitted for real
    # again with the browser's cookies: the same order, nothing charged twice.
    again = page.request.post(action, form=dict(data), max_redirects=0)
    assert again.status in (302, 303), (again.status, again.text()[:500])
    assert again.headers["location"].endswith(f"/orders/{order.id}/"), again.headers
    ui.visit(page, f"/orders/{order.id}/")
    assert_order_shown(page, order)
    assert_one_order_one_charge(shop, username)
    assert StockItem.objects.get(product__sku="MUG").on_hand == 4


def test_without_javascript_a_second_submit_meeting_the_first_lands_on_its_order(
    shop, new_context, make_product
):
    """The second click sends the form while the first POST still runs (a slow provider):
    the in-use page, then a reload lands on the one order (the double click's slow path)."""
    make_product("MUG", price="8.50", stock=5)
    page = new_context(shop, java_script_enabled=False).new_page()
    username = ui.signup(page)
    add_to_cart(page, "MUG", 1)
    fill_checkout(page)
    key = dict(rendered_form(page)[1])["idempotency_key"]
    answers: list[int] = []
    page.on("response", lambda r: r.request.method == "POST" and answers.append(r.status))
    button = place_order_button(page)
    button.scroll_into_view_if_needed()
    box = button.bounding_box()
    assert box is not None
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    shop.simulator.faults(latency_ms=1500)
    try:
        page.mouse.click(x, y)  # the first POST reaches the shop, which calls the provider
        wait_until(lambda: Order.objects.filter(owner__username=username).exists())
        page.mouse.click(x, y)  # the form again: the browser aborts the first request
        land_on_the_order(page, username=username, key=key)
    finally:
        shop.simulator.faults(latency_ms=0)
    assert answers[:2] == [409, 303], answers
    order = assert_one_order_one_charge(shop, username)
    assert_order_shown(page, order)
    assert StockItem.objects.get(product__sku="MUG").on_hand == 4


def test_two_fast_submits_of_one_rendered_form_make_one_order(shop, page, make_product):
    """The same checkout form POSTed twice at once, outside the browser, with its cookies."""
    make_product("MUG", price="8.50", stock=5)
    username = ui.signup(page)
    add_to_cart(page, "MUG", 2)
    fill_checkout(page)
    action, data = rendered_form(page)
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    barrier = threading.Barrier(2)
    answers: list[requests.Response] = []

    def submit() -> None:
        barrier.wait()
        answers.append(
            requests.post(action, data=data, cookies=cookies, allow_redirects=False, timeout=60)
        )

    threads = [threading.Thread(target=submit) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(a.status_code < 500 for a in answers), [(a.status_code, a.text) for a in answers]
    order = assert_one_order_one_charge(shop, username)
    assert order.status == "confirmed"
    assert [a.status_code for a in answers].count(303) >= 1, [a.status_code for a in answers]
    for answer in answers:
        if answer.status_code == 303:
            assert answer.headers["Location"].endswith(f"/orders/{order.id}/")
    assert StockItem.objects.get(product__sku="MUG").on_hand == 3


def test_same_cart_from_two_tabs_then_refresh_and_back_resubmit_make_one_order(
    shop, context, make_product
):
    make_product("MUG", price="8.50", stock=5)
    first = context.new_page()
    username = ui.signup(first)
    add_to_cart(first, "MUG", 1)
    second = context.new_page()
    fill_checkout(first)
    fill_checkout(second)

    order = place_order(first)
    with second.expect_navigation() as navigation:
        place_order_button(second).click()
    assert navigation.value is None or navigation.value.status < 500
    second.wait_for_load_state()
    order = assert_one_order_one_charge(shop, username)
    assert_order_shown(first, order)

    first.reload()
    assert_order_shown(first, order)
    first.go_back()
    first.wait_for_load_state()
    if place_order_button(first).count():
        place_order_button(first).click()
        first.wait_for_load_state()
    assert_one_order_one_charge(shop, username)
    ui.visit(first, f"/orders/{order.id}/")
    assert_order_shown(first, order)
    assert StockItem.objects.get(product__sku="MUG").on_hand == 4


# --- Short stock: ask -------------------------------------------------------------


def test_ask_then_confirm_available_items_is_partially_confirmed(shop, page, make_product):
    make_product("RARE", price="30.00", stock=1)
    make_product("MUG", price="8.50", stock=5)
    username = ui.signup(page)
    add_to_cart(page, "RARE", 3)
    add_to_cart(page, "MUG", 1)
    fill_checkout(page, on_shortage="ask")
    order = place_order(page)
    assert order.status == "awaiting_decision"
    assert_order_shown(page, order)
    assert shop.charges(order.number) == []
    ui.check_page(page, "order-awaiting-decision")

    page.get_by_role("button", name="Confirm available items").click()
    page.wait_for_url(ORDER_URL)
    order.refresh_from_db()
    assert order.status == "partially_confirmed"
    assert_order_shown(page, order)
    lines = {line.product.sku: line for line in order.lines.select_related("product")}
    assert lines["RARE"].quantity_confirmed == 1
    assert lines["MUG"].quantity_confirmed == 1
    assert_one_order_one_charge(shop, username)
    (charge,) = shop.charges(order.number)
    assert Decimal(str(charge["amount"])) == Decimal("38.50"), charge


def test_ask_left_alone_expires_and_releases_the_stock(live_shop, shop, new_context, make_product):
    """A short reservation TTL on a second web server; the worker's beat expires the order."""
    make_product("RARE", price="30.00", stock=1)
    env = ui.shop_env(live_shop.simulator, ORDER_RESERVATION_TTL_SECONDS="3")
    with gunicorn_server(env=env, workers=1, log_dir=live_shop.log_dir) as server:
        short = ui.LiveShop(url=server.url, simulator=live_shop.simulator, server=server)
        page = new_context(short).new_page()
        ui.signup(page)
        add_to_cart(page, "RARE", 2)
        fill_checkout(page, on_shortage="ask")
        order = place_order(page)
        assert order.status == "awaiting_decision"
        assert held("RARE") == 1

        wait_until(
            lambda: Order.objects.filter(id=order.id, status="expired").exists(),
            timeout=30,
            message="the beat's expiry sweep to expire the order",
        )
        page.reload()
        assert_order_shown(page, order)
        assert held("RARE") == 0
        assert not Reservation.objects.filter(state="held").exists()
        assert short.charges(order.number) == []
        assert not page.get_by_role("button", name="Confirm available items").count()


# --- Payments: declined, then pending -----------------------------------------------


def test_declined_card_says_so_reserves_nothing_then_another_card_makes_one_order(
    shop, page, make_product
):
    make_product("MUG", price="8.50", stock=5)
    username = ui.signup(page)
    add_to_cart(page, "MUG", 2)
    fill_checkout(page, payment_method="pm_card_declined")
    place_order_button(page).click()
    page.wait_for_load_state()
    text = page.locator("body").inner_text()
    assert re.search(r"declined", text, re.I), f"no clear decline message:\n{text}"
    ui.check_page(page, "payment-declined")
    assert held("MUG") == 0
    assert (
        not Order.objects.filter(owner__username=username).exclude(status="payment_failed").exists()
    )

    fill_checkout(page, payment_method="pm_card_ok")
    order = place_order(page)
    assert order.status == "confirmed"
    assert_order_shown(page, order)
    confirmed = Order.objects.filter(owner__username=username, status="confirmed")
    assert confirmed.count() == 1
    assert len(shop.charges(order.number)) == 1
    for failed in Order.objects.filter(owner__username=username, status="payment_failed"):
        assert shop.charges(failed.number) == []
    assert StockItem.objects.get(product__sku="MUG").on_hand == 3
    assert held("MUG") == 0


def test_payment_pending_is_settled_by_the_worker_and_the_page_shows_it(shop, page, make_product):
    """The provider's answer is lost: the order page says pending, then (reloaded) confirmed."""
    make_product("MUG", price="8.50", stock=5)
    username = ui.signup(page)
    add_to_cart(page, "MUG", 1)
    fill_checkout(page, payment_method="pm_card_timeout")
    order = place_order(page)
    assert order.status == "payment_pending"
    assert_order_shown(page, order)
    ui.check_page(page, "order-payment-pending")

    deadline = time.monotonic() + 60
    while True:
        order.refresh_from_db()
        if order.status == "confirmed":
            break
        assert time.monotonic() < deadline, f"never settled; worker log:\n{shop.logs()}"
        time.sleep(1)
    _reload_updating_page(page)
    assert_order_shown(page, order)
    assert_one_order_one_charge(shop, username)
    assert held("MUG") == 0


def _reload_updating_page(page) -> None:
    """Reload a pending order's page, which also reloads itself once the payment
    settles: its own navigation aborts ours, and the page it loads is the one we want."""
    for attempt in range(3):
        try:
            page.reload()
            return
        except PlaywrightError as exc:
            if "ERR_ABORTED" not in str(exc) or attempt == 2:
                raise
            page.wait_for_load_state()


# --- CSRF -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/checkout/", "/cart/", "/accounts/login/"])
def test_storefront_post_without_csrf_token_is_refused(make_user, path):
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user())
    response = client.post(path, {"Quantity": "1"})
    assert response.status_code == 403, (response.status_code, response.content[:300])


# --- Accounts: password reset and change, e-mail change -------------------------------


def _mailed_link(mail_dir, *, timeout: float = 30) -> str:
    """The reset link of the one e-mail the shop wrote to `mail_dir` (the file backend)."""

    def found():
        for path in mail_dir.glob("*.log"):
            match = re.search(r"https?://\S+/accounts/password-reset/\S+/\S+/", path.read_text())
            if match:
                return match[0]
        return None

    return wait_until(found, timeout=timeout, message="the password reset e-mail")


def test_a_shopper_resets_a_forgotten_password_then_changes_it_and_the_email(
    live_shop, shop, new_context, tmp_path
):
    """Reset by e-mail (the link from the mail the shop sent), then change the password and the
    e-mail address on the account pages; every page at two widths, axe-clean."""
    mail_dir = tmp_path / "mail"
    mail_dir.mkdir()
    env = ui.shop_env(
        live_shop.simulator,
        EMAIL_URL=f"file://{mail_dir}",
        SHOP_TOKEN_THROTTLE_RATE="100/min",
    )
    with gunicorn_server(env=env, workers=1, log_dir=live_shop.log_dir) as server:
        mailing = ui.LiveShop(url=server.url, simulator=live_shop.simulator, server=server)
        page = new_context(mailing).new_page()
        username = ui.signup(page)
        page.get_by_role("button", name="Log out", exact=True).click()
        page.wait_for_load_state()

        ui.visit(page, "/accounts/login/")
        page.get_by_role("link", name="Forgot your password?").click()
        page.wait_for_url(re.compile(r"/accounts/password-reset/$"))
        ui.check_page(page, "password-reset")
        page.get_by_label("Email", exact=True).fill(f"{username}@example.com")
        page.get_by_role("button", name="Reset password").click()
        page.wait_for_url(re.compile(r"/accounts/password-reset/done/$"))
        ui.check_page(page, "password-reset-done")

        link = _mailed_link(mail_dir)
        assert link.startswith(mailing.url), link
        ui.visit(page, link)
        ui.check_page(page, "password-reset-confirm")
        new_password = "a brand new passphrase 7"
        page.get_by_label("Password", exact=True).fill(new_password)
        page.get_by_label("Confirm password", exact=True).fill(new_password)
        page.get_by_role("button", name="Set password").click()
        page.wait_for_url(re.compile(r"/accounts/password-reset/complete/$"))
        ui.check_page(page, "password-reset-complete")
        ui.visit(page, link)  # used once: the link says so
        assert page.get_by_text("does not work any more").count()

        ui.login(page, username, password=new_password)
        ui.visit(page, "/account/")
        page.get_by_role("link", name="Change your password").click()
        page.wait_for_url(re.compile(r"/accounts/password-change/$"))
        ui.check_page(page, "password-change")
        page.get_by_label("Current password", exact=True).fill(new_password)
        page.get_by_label("New password", exact=True).fill(ui.PASSWORD)
        page.get_by_label("Confirm new password", exact=True).fill(ui.PASSWORD)
        page.get_by_role("button", name="Change password").click()
        page.wait_for_url(re.compile(r"/accounts/password-change/done/$"))
        ui.check_page(page, "password-change-done")

        ui.visit(page, "/account/")
        page.get_by_label("Email", exact=True).fill("not an address")
        page.get_by_label("Current password", exact=True).fill(ui.PASSWORD)
        page.get_by_role("button", name="Change email").click()
        page.wait_for_load_state()
        assert page.get_by_label("Email", exact=True).get_attribute("aria-invalid") == "true"
        ui.check_page(page, "account-email-error")
        page.get_by_label("Email", exact=True).fill(f"{username}@new.example")
        page.get_by_label("Current password", exact=True).fill(ui.PASSWORD)
        page.get_by_role("button", name="Change email").click()
        page.wait_for_url(re.compile(r"/account/$"))
        assert page.get_by_text(f"{username}@new.example").count()
        ui.check_page(page, "account")


# --- The guest cart -----------------------------------------------------------------------


def test_a_guest_cart_survives_log_in_without_javascript(
    shop, new_context, make_product, django_user_model
):
    """Logged out, "Add to cart" keeps the item; "Go to checkout" asks to log in; after log-in
    the checkout shows the guest's items merged into the shopper's cart (quantities added)."""
    from shop.cart import cart_add, cart_for

    make_product("MUG", price="8.50", stock=5, name="Enamel mug")
    make_product("TEE-M", price="19.99", stock=5, name="T-shirt, medium")
    username = ui.unique_name()
    shopper = django_user_model.objects.create_user(
        username=username, email=f"{username}@example.com", password=ui.PASSWORD
    )
    cart_add(cart=cart_for(user=shopper), version=0, sku="MUG", quantity=1)

    page = new_context(shop, java_script_enabled=False).new_page()
    add_to_cart(page, "MUG", 2)
    add_to_cart(page, "TEE-M", 1)
    assert re.search(r"/cart/$", page.url), page.url
    assert page.get_by_text("Enamel mug").count() and page.get_by_text("T-shirt, medium").count()
    ui.check_page(page, "cart-guest-no-script", axe=False)  # axe needs script; see below

    page.get_by_role("link", name="Go to checkout").click()
    page.wait_for_url(re.compile(r"/accounts/login/\?next=/checkout/$"))
    page.get_by_label("Username", exact=True).fill(username)
    page.get_by_label("Password", exact=True).fill(ui.PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(r"/checkout/$"))
    text = page.locator("main").inner_text()
    assert "3 × Enamel mug" in text and "1 × T-shirt, medium" in text, text
    ui.check_page(page, "checkout-after-merge", axe=False)
    fill_checkout(page)
    order = place_order(page)
    assert order.status == "confirmed"
    assert {line.product.sku: line.quantity_requested for line in order.lines.all()} == {
        "MUG": 3,
        "TEE-M": 1,
    }


# --- Cancel a confirmed order; search; paging ---------------------------------------------


def test_cancel_order_shows_cancelling_then_cancelled(shop, page, make_product):
    """The worker runs the cancellation (refund, restock); the page polls and shows the end."""
    make_product("MUG", price="8.50", stock=5)
    username = ui.signup(page)
    add_to_cart(page, "MUG", 2)
    fill_checkout(page)
    order = place_order(page)
    assert order.status == "confirmed"
    ui.check_page(page, "order-cancellable")

    page.get_by_role("button", name="Cancel order").click()
    page.wait_for_url(ORDER_URL)
    order.refresh_from_db()
    assert order.status in ("cancelling", "cancelled")
    if order.status == "cancelling":
        assert page.get_by_text("Being cancelled").count()
        ui.check_page(page, "order-cancelling")
    # htmx polls the status block and reloads the page once the worker is done.
    page.get_by_text("This order was cancelled").wait_for(timeout=60_000)
    order.refresh_from_db()
    assert order.status == "cancelled"
    assert_order_shown(page, order)
    assert not page.get_by_role("button", name="Cancel order").count()
    ui.check_page(page, "order-cancelled")
    assert StockItem.objects.get(product__sku="MUG").on_hand == 5
    refunds = [
        op
        for op in shop.simulator.ledger()
        if op["kind"] == "refund" and op["status"] == "succeeded"
    ]
    assert len(refunds) == 1, refunds
    assert Order.objects.filter(owner__username=username).count() == 1


def test_catalog_search_and_order_pages(shop, page, make_product):
    from orders.services import order_hold
    from tests.orders.conftest import ADDRESS as ORDER_ADDRESS
    from tests.orders.conftest import line_requests

    make_product("MUG", price="8.50", stock=50, name="Enamel mug")
    make_product("TEE-M", price="19.99", stock=5, name="T-shirt, medium")
    ui.visit(page, "/")
    page.get_by_label("Search", exact=True).fill("mug")
    page.get_by_role("button", name="Search").click()
    page.wait_for_url(re.compile(r"/\?q=mug$"))
    assert page.get_by_text("Enamel mug").count() and not page.get_by_text("T-shirt").count()
    ui.check_page(page, "catalog-search")
    add_to_cart(page, "MUG", 1)  # as a guest
    ui.visit(page, "/cart/")
    assert page.get_by_text("your cart comes with you").count()
    ui.check_page(page, "cart-guest")

    username = ui.signup(page)
    from django.contrib.auth import get_user_model

    shopper = get_user_model().objects.get(username=username)
    for _ in range(25):
        order_hold(
            owner=shopper,
            lines=line_requests({"MUG": 1}),
            on_shortage="ask",
            payment_method="pm_card_ok",
            shipping_address=ORDER_ADDRESS,
        )
    ui.visit(page, "/orders/")
    assert page.locator("tbody tr").count() == 20
    ui.check_page(page, "orders-page-1")
    page.get_by_role("link", name="Older orders").click()
    page.wait_for_url(re.compile(r"/orders/\?before=\d+$"))
    assert page.locator("tbody tr").count() == 5
    ui.check_page(page, "orders-page-2")
    page.get_by_role("link", name="Newer orders").click()
    page.wait_for_url(re.compile(r"/orders/\?after=\d+$"))
    assert page.locator("tbody tr").count() == 20


# --- In French -------------------------------------------------------------------


def test_a_shopper_switches_to_french_and_checks_out_in_french(shop, page, make_product):
    """The footer's switcher turns the storefront French: labels, buttons, statuses and
    money ("19,99 €"); one order, one charge. Screenshots at both widths, axe-clean."""
    make_product("TEE-M", price="19.99", stock=5, name="T-shirt, medium")
    ui.visit(page, "/accounts/signup/")
    page.get_by_role("button", name="Français").click()
    page.wait_for_load_state()
    assert page.locator("html").get_attribute("lang") == "fr"
    assert page.get_by_role("heading", name="S'inscrire").count()
    ui.check_page(page, "fr-signup")
    username = ui.unique_name()
    page.get_by_label("Nom d'utilisateur", exact=True).fill(username)
    page.get_by_label("E-mail", exact=True).fill(f"{username}@example.com")
    page.get_by_label("Mot de passe", exact=True).fill(ui.PASSWORD)
    page.get_by_role("button", name="S'inscrire").click()
    page.wait_for_load_state()
    assert page.get_by_role("button", name="Se déconnecter", exact=True).count()

    ui.visit(page, "/products/TEE-M/")
    assert re.search(r"19,99\s€", page.locator(".price").inner_text())
    assert page.get_by_text("Plus que 5").count()
    ui.check_page(page, "fr-product")
    page.get_by_label("Quantité", exact=True).fill("2")
    page.get_by_role("button", name="Ajouter au panier").click()
    page.wait_for_load_state()
    ui.visit(page, "/cart/")
    assert re.search(r"Total\s+39,98\s€", page.locator(".total").inner_text())
    ui.check_page(page, "fr-cart")

    ui.visit(page, "/checkout/")
    for label, value in {
        "Nom": "Ada Lovelace",
        "Adresse": "1 rue de l'Analyse",
        "Ville": "Paris",
        "Code postal": "75001",
        "Pays": "FR",
        "Moyen de paiement": "pm_card_ok",
    }.items():
        ui.fill_field(page.get_by_label(label, exact=True), value)
    assert page.get_by_label("Pays", exact=True).locator("option:checked").inner_text() == "France"
    ui.check_page(page, "fr-checkout")
    page.get_by_role("button", name="Passer la commande").click()
    page.wait_for_url(ORDER_URL)
    order = order_on(page)
    assert order.status == "confirmed"
    text = page.locator("body").inner_text()
    assert f"Commande {order.number}" in text and "Confirmée" in text
    assert re.search(r"Total\s+39,98\s€", text) and "Order" not in text
    ui.check_page(page, "fr-order")
    assert_one_order_one_charge(shop, username)

    ui.visit(page, "/orders/")
    assert page.get_by_role("heading", name="Vos commandes").count()
    ui.check_page(page, "fr-orders")
    page.get_by_role("button", name="English").click()
    page.wait_for_load_state()
    assert page.get_by_role("heading", name="Your orders").count()
