"""The order pages' "Cancel order" on a confirmed order, paging of /orders/, catalog search."""

from __future__ import annotations

import re

import pytest
from celery import current_app
from django.test import Client

from idempotency.views import REPLAYED_HEADER
from inventory.models import StockItem
from orders.models import Order
from orders.services import order_hold
from tests.orders.compensation_support import drive
from tests.orders.conftest import ADDRESS, line_requests

from .conftest import add_to_cart, checkout_form, order_id_of
from .test_pages import assert_one_host, names_in

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def catalog(make_product):
    make_product("TEE-M", price="19.99", stock=8, name="T-shirt, size M")
    make_product("MUG", price="12.50", stock=3, name="Enamel mug")
    make_product("CAP-RED", price="9.00", stock=3, name="Baseball cap")


@pytest.fixture
def quiet_bells(monkeypatch, settings):
    """The test plays the worker (drive); no task is sent to a broker."""
    settings.COMPENSATION_WAIT_SECONDS = 0.01
    monkeypatch.setattr(current_app, "send_task", lambda *a, **kw: None)


def cancel_form_key(html: str) -> str:
    form = re.search(r'action="[^"]*/cancel/".*?</form>', html, re.S)[0]
    return re.search(r'name="idempotency_key" value="([^"]+)"', form)[1]


# --- Cancel order -------------------------------------------------------------------


def test_cancel_order_on_a_confirmed_order_is_cancelling_then_cancelled(
    browser, catalog, provider, quiet_bells
):
    add_to_cart(browser, "TEE-M", 2)
    order_id = order_id_of(browser.post("/checkout/", checkout_form(browser)))
    page = browser.get(f"/orders/{order_id}/").content.decode()
    names_in(page, "Cancel order")
    assert "Cancelling refunds" in page
    key = cancel_form_key(page)
    assert key == cancel_form_key(browser.get(f"/orders/{order_id}/").content.decode())

    first = browser.post(f"/orders/{order_id}/cancel/", {"idempotency_key": key})
    assert first.status_code == 303 and first["Location"] == f"/orders/{order_id}/"
    # A double click (or a second tab of the same page) replays the same answer.
    again = browser.post(f"/orders/{order_id}/cancel/", {"idempotency_key": key})
    assert again.status_code == 303 and again[REPLAYED_HEADER] == "true"
    order = Order.objects.get(id=order_id)
    assert order.status == "cancelling"
    shown = browser.get(f"/orders/{order_id}/").content.decode()
    assert "Being cancelled" in shown
    assert f'hx-get="/orders/{order_id}/status/?shown=cancelling"' in shown
    assert ">Cancel order</button>" not in shown
    fragment = browser.get(f"/orders/{order_id}/status/?shown=cancelling")
    assert "HX-Refresh" not in fragment

    drive(order=order, kind="cancellation")
    order.refresh_from_db()
    assert order.status == "cancelled"
    assert browser.get(f"/orders/{order_id}/status/?shown=cancelling")["HX-Refresh"] == "true"
    done = browser.get(f"/orders/{order_id}/").content.decode()
    assert "Cancelled" in done and ">Cancel order</button>" not in done
    assert StockItem.objects.get(product__sku="TEE-M").on_hand == 8
    refunds = [op for op in provider.ledger() if op["kind"] == "refund"]
    assert len(refunds) == 1 and refunds[0]["amount"] == "39.98"


def test_no_cancel_button_once_shipped_and_a_stale_form_is_refused(
    browser, catalog, provider, quiet_bells
):
    from orders.shipments import shipment_create

    add_to_cart(browser, "TEE-M", 1)
    order_id = order_id_of(browser.post("/checkout/", checkout_form(browser)))
    key = cancel_form_key(browser.get(f"/orders/{order_id}/").content.decode())
    shipment_create(order_id=order_id, lines=None, carrier="DemoPost", tracking_number="DP1")
    assert ">Cancel order</button>" not in browser.get(f"/orders/{order_id}/").content.decode()
    refused = browser.post(f"/orders/{order_id}/cancel/", {"idempotency_key": key})
    assert refused.status_code == 303 and "problem=order_shipped" in refused["Location"]
    assert Order.objects.get(id=order_id).status == "confirmed"
    assert "shipped" in browser.get(refused["Location"]).content.decode().lower()


def test_the_cancel_form_refuses_a_post_without_csrf(browser, catalog, provider, shopper):
    add_to_cart(browser, "TEE-M", 1)
    order_id = order_id_of(browser.post("/checkout/", checkout_form(browser)))
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(shopper)
    response = strict.post(f"/orders/{order_id}/cancel/", {"idempotency_key": "k"})
    assert response.status_code == 403
    assert Order.objects.get(id=order_id).status == "confirmed"


# --- Paging of /orders/ ---------------------------------------------------------------


def test_the_order_list_pages_by_links_without_a_cap(browser, make_product, shopper, make_user):
    make_product("MANY", price="1.00", stock=100)
    for _ in range(45):
        order_hold(
            owner=shopper,
            lines=line_requests({"MANY": 1}),
            on_shortage="ask",
            payment_method="pm_card_ok",
            shipping_address=ADDRESS,
        )
    order_hold(  # someone else's: never listed
        owner=make_user(),
        lines=line_requests({"MANY": 1}),
        on_shortage="ask",
        payment_method="pm_card_ok",
        shipping_address=ADDRESS,
    )
    mine = list(Order.objects.filter(owner=shopper).order_by("-number"))
    seen, url, pages = [], "/orders/", 0
    while url:
        html = browser.get(url).content.decode()
        assert_one_host(html)
        seen += [int(n) for n in re.findall(r">Order (\d+)</a>", html)]
        pages += 1
        older = re.search(r'href="([^"]+)" rel="next">Older orders', html)
        url = older[1].replace("&amp;", "&") if older else None
    assert seen == [order.number for order in mine] and pages == 3
    # Back from the last page: "Newer orders" gives the page before it.
    last = browser.get(f"/orders/?before={mine[39].number}").content.decode()
    newer = re.search(r'href="([^"]+)" rel="prev">Newer orders', last)[1]
    middle = browser.get(newer).content.decode()
    assert [int(n) for n in re.findall(r">Order (\d+)</a>", middle)] == [
        order.number for order in mine[20:40]
    ]
    first = browser.get("/orders/").content.decode()
    assert "Newer orders" not in first and "Older orders" in first
    assert browser.get("/orders/?before=abc").status_code == 200


# --- Catalog search ------------------------------------------------------------------


def test_the_catalog_searches_names_and_skus(client, catalog):
    html = client.get("/").content.decode()
    assert '<label for="search-q">Search</label>' in html and 'role="search"' in html
    by_name = client.get("/", {"q": "mug"}).content.decode()
    assert "Enamel mug" in by_name and "T-shirt" not in by_name and "Baseball cap" not in by_name
    by_sku = client.get("/", {"q": "cap-r"}).content.decode()
    assert "Baseball cap" in by_sku and "Enamel mug" not in by_sku
    assert "1 product found" in by_sku
    nothing = client.get("/", {"q": "zzz"}).content.decode()
    assert "Nothing matches" in nothing and 'value="zzz"' in nothing
    escaped = client.get("/", {"q": "<script>"}).content.decode()
    assert "<script>" not in escaped.split("<main", 1)[1]
    assert client.get("/", {"q": "x" * 5000}).status_code == 200
