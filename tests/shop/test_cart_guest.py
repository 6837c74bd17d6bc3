"""The guest's cart: kept in the session, merged once into the shopper's cart on log-in.

The rule for a sku in both carts: the quantities add, capped at 1000 (the
most one line holds). A double-submitted log-in — two requests that both read
the session before either cycled it — merges once: the guest cart's id is
claimed in the inbox in the merge's transaction (shop.cart.cart_merge).
"""

from __future__ import annotations

import threading

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import transaction
from django.db.models import F
from django.test import Client

from idempotency.models import InboxMessage
from shop import cart as carts
from shop.models import Cart, CartLine
from tests.concurrency import Workers, wait_for_lock_waiters

from .conftest import cart_version

pytestmark = pytest.mark.django_db(transaction=True)

User = get_user_model()
PASSWORD = "correct horse battery"  # make_user's


@pytest.fixture
def catalog(make_product):
    make_product("TEE-M", price="19.99", stock=8, name="T-shirt, size M")
    make_product("MUG", price="12.50", stock=3, name="Enamel mug")


@pytest.fixture(autouse=True)
def _fresh_throttles():
    cache.clear()
    yield
    cache.clear()


def guest_add(client: Client, sku: str, quantity: int) -> None:
    version = carts.guest_cart(session=client.session).version
    response = client.post(f"/products/{sku}/", {"quantity": quantity, "cart_version": version})
    assert response.status_code == 303 and response["Location"] == "/cart/", response


def lines_of(user) -> dict[str, int]:
    return dict(CartLine.objects.filter(cart__user=user).values_list("sku", "quantity"))


def log_in(client: Client, user, *, next_path: str = "") -> object:
    data = {"username": user.username, "password": PASSWORD}
    if next_path:
        data["next"] = next_path
    response = client.post("/accounts/login/", data)
    assert response.status_code == 303, response
    return response


def copy_of_session(client: Client) -> Client:
    """A second request of the same browser that read the session before the first logged in
    (Django's login() cycles the session key, so a real copy needs a race; this is it)."""
    from importlib import import_module

    store = import_module(settings.SESSION_ENGINE).SessionStore()
    for key, value in client.session.items():
        store[key] = value
    store.create()
    twin = Client()
    twin.cookies[settings.SESSION_COOKIE_NAME] = store.session_key
    return twin


# --- the session cart -------------------------------------------------------------


def test_a_guest_fills_a_cart_and_a_double_click_adds_once(client, catalog):
    guest_add(client, "TEE-M", 2)
    version = carts.guest_cart(session=client.session).version
    form = {"quantity": "1", "cart_version": str(version)}
    assert client.post("/products/MUG/", form).status_code == 303
    assert client.post("/products/MUG/", form).status_code == 303  # the same form again
    assert carts.guest_cart(session=client.session).lines == [("TEE-M", 2), ("MUG", 1)]
    html = client.get("/cart/").content.decode()
    assert "T-shirt, size M" in html and "Enamel mug" in html
    assert 'Cart <span class="count">(3)</span>' in html


def test_a_guest_changes_and_removes_lines_on_the_cart_page(client, catalog):
    guest_add(client, "TEE-M", 2)
    guest_add(client, "MUG", 1)
    version = carts.guest_cart(session=client.session).version
    client.post("/cart/", {"cart_version": version, "sku": "TEE-M", "quantity": "5"})
    stale = client.post("/cart/", {"cart_version": version, "sku": "MUG", "action": "remove"})
    assert stale.status_code == 303
    assert "Your cart changed" in client.get("/cart/").content.decode()
    version = carts.guest_cart(session=client.session).version
    client.post("/cart/", {"cart_version": version, "sku": "MUG", "action": "remove"})
    assert carts.guest_cart(session=client.session).lines == [("TEE-M", 5)]
    bad = client.post("/cart/", {"cart_version": version + 1, "sku": "TEE-M", "quantity": "1001"})
    assert bad.status_code == 303
    assert carts.guest_cart(session=client.session).lines == [("TEE-M", 5)]


def test_checkout_asks_a_guest_to_log_in_and_the_cart_comes_along(client, catalog, make_user):
    shopper = make_user()
    guest_add(client, "TEE-M", 2)
    response = client.get("/checkout/")
    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/?next=/checkout/"
    logged_in = log_in(client, shopper, next_path="/checkout/")
    assert logged_in["Location"] == "/checkout/"
    assert lines_of(shopper) == {"TEE-M": 2}
    assert carts.GUEST_CART not in client.session
    assert "T-shirt, size M" in client.get("/checkout/").content.decode()


# --- merging ----------------------------------------------------------------------


def test_log_in_merges_quantities_add_and_are_capped(client, catalog, make_user):
    shopper = make_user()
    cart = carts.cart_for(user=shopper)
    carts.cart_add(cart=cart, version=0, sku="TEE-M", quantity=2)
    carts.cart_add(cart=cart, version=1, sku="MUG", quantity=900)
    before = cart_version(shopper)
    guest_add(client, "TEE-M", 3)
    guest_add(client, "MUG", 200)
    log_in(client, shopper)
    assert lines_of(shopper) == {"TEE-M": 5, "MUG": 1000}
    # The merge moved the cart on: a checkout page shown before it is "your cart changed".
    assert cart_version(shopper) == before + 1
    assert "The items you added before logging in are in your cart" in (
        client.get("/cart/").content.decode()
    )


def test_sign_up_takes_the_guest_cart_along(client, catalog):
    guest_add(client, "MUG", 2)
    response = client.post(
        "/accounts/signup/",
        {"username": "newbie", "email": "newbie@example.com", "password": "Corr3ct-horse!"},
    )
    assert response.status_code == 303
    assert lines_of(User.objects.get(username="newbie")) == {"MUG": 2}


def test_a_double_submitted_log_in_merges_once(client, catalog, make_user):
    shopper = make_user()
    guest_add(client, "TEE-M", 2)
    twin = copy_of_session(client)  # the second submit read the same session
    log_in(client, shopper)
    log_in(twin, shopper)
    assert lines_of(shopper) == {"TEE-M": 2}
    assert InboxMessage.objects.filter(consumer=carts.GUEST_MERGE).count() == 1


def test_logging_out_and_in_again_does_not_merge_again(client, catalog, make_user):
    shopper = make_user()
    guest_add(client, "TEE-M", 2)
    log_in(client, shopper)
    client.post("/accounts/logout/")
    log_in(client, shopper)
    assert lines_of(shopper) == {"TEE-M": 2}


def _merge_twin(*, cart_id: int, lines: list[tuple[str, int]]) -> bool:
    """Deliberately wrong: merge without claiming the guest cart's id (no inbox)."""
    with transaction.atomic():
        Cart.objects.filter(id=cart_id).update(version=F("version") + 1)
        for sku, quantity in lines:
            updated = CartLine.objects.filter(cart_id=cart_id, sku=sku).update(
                quantity=F("quantity") + quantity
            )
            if not updated:
                CartLine.objects.create(cart_id=cart_id, sku=sku, quantity=quantity)
    return True


def test_without_the_inbox_a_double_submitted_log_in_doubles_the_lines(catalog, make_user):
    shopper = make_user()
    cart = carts.cart_for(user=shopper)
    lines = [("TEE-M", 2)]
    _merge_twin(cart_id=cart.id, lines=lines)
    _merge_twin(cart_id=cart.id, lines=lines)
    assert lines_of(shopper) == {"TEE-M": 4}  # what the inbox claim prevents


def test_two_merges_of_one_guest_cart_at_once_merge_once(catalog, make_user, monkeypatch):
    """Both in their transactions at once: the second waits on the first's inbox row, skips."""
    shopper = make_user()
    cart = carts.cart_for(user=shopper)
    carts.cart_add(cart=cart, version=0, sku="TEE-M", quantity=1)
    claimed, release = threading.Event(), threading.Event()
    real_claim = carts.inbox_claim
    first = threading.Lock()

    def claim(**kwargs):
        result = real_claim(**kwargs)
        if first.acquire(blocking=False):  # the first claimer holds its transaction open
            claimed.set()
            assert release.wait(timeout=30)
        return result

    monkeypatch.setattr(carts, "inbox_claim", claim)
    barrier = threading.Barrier(2)

    def merge():
        barrier.wait(timeout=30)
        return carts.cart_merge(cart_id=cart.id, guest_id="guest-1", lines=[("TEE-M", 2)])

    workers = Workers()
    workers.start(merge)
    workers.start(merge)
    assert claimed.wait(timeout=30)
    wait_for_lock_waiters(1)  # the overlap is real: the second is blocked on the first's claim
    release.set()
    assert sorted(workers.join()) == [False, True]
    assert lines_of(shopper) == {"TEE-M": 3}
