"""Staff adjust stock in the admin: a keyed form, as the API's stock endpoint.

A double submit or a second tab of one form adjusts once; the reason is in
the stock item's history; a refusal (409 stock_below_reserved) comes back to
the form as a message with the problem's title; view-only staff get 403.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.test import Client

from idempotency.models import IdempotencyKey
from inventory.models import Product, StockItem
from inventory.services import reservations_hold

pytestmark = pytest.mark.django_db


def browser_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def admin_browser(make_user):
    user = make_user(staff=True)
    user.is_superuser = True
    user.save(update_fields=["is_superuser"])
    return browser_for(user)


@pytest.fixture
def viewer(make_user):
    user = make_user(staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_stockitem", "view_product"])
    )
    return browser_for(user)


@pytest.fixture
def stock(make_product):
    make_product("TEE-M", stock=5)
    item = StockItem.objects.select_related("product").get(product__sku="TEE-M")
    reservations_hold(requests={item.id: 2}, partial=False)
    return item


def adjust_url(stock) -> str:
    return f"/admin/inventory/stockitem/{stock.pk}/adjust/"


def form_key(page) -> str:
    assert page.status_code == 200, page.status_code
    return re.search(r'name="idempotency_key" value="([^"]+)"', page.content.decode()).group(1)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def counters(stock) -> tuple[int, int]:
    item = StockItem.objects.get(pk=stock.pk)
    return item.on_hand, item.reserved


def test_adjust_twice_from_one_form_adjusts_once_with_its_reason(admin_browser, stock):
    page = admin_browser.get(adjust_url(stock))
    assert b"5</strong> on hand" in page.content
    body = {
        "idempotency_key": form_key(page),
        "mode": "delta",
        "quantity": "3",
        "reason": "recount",
    }
    answers = [admin_browser.post(adjust_url(stock), body) for _ in range(2)]
    assert [a.status_code for a in answers] == [303, 303]
    assert answers[1]["Idempotent-Replayed"] == "true"
    assert counters(stock) == (8, 2)
    (entry,) = LogEntry.objects.filter(object_id=str(stock.pk))
    assert "delta +3" in entry.change_message and "recount" in entry.change_message
    done = admin_browser.get(answers[0]["Location"])
    assert "TEE-M: 8 on hand, 6 available." in messages_of(done)


def test_two_tabs_share_one_key_and_set_once(admin_browser, stock):
    keys = [form_key(admin_browser.get(adjust_url(stock))) for _ in range(2)]
    assert keys[0] == keys[1]
    for key in keys:
        body = {"idempotency_key": key, "mode": "set", "quantity": "20", "reason": "delivery"}
        assert admin_browser.post(adjust_url(stock), body).status_code == 303
    assert counters(stock) == (20, 2)
    assert LogEntry.objects.filter(object_id=str(stock.pk)).count() == 1
    assert form_key(admin_browser.get(adjust_url(stock))) != keys[0]


def test_below_reserved_is_a_message_with_the_problems_title(admin_browser, stock):
    key = form_key(admin_browser.get(adjust_url(stock)))
    body = {"idempotency_key": key, "mode": "set", "quantity": "1", "reason": "broken"}
    answer = admin_browser.post(adjust_url(stock), body)
    assert answer.status_code == 303 and answer["Location"].startswith(adjust_url(stock))
    page = admin_browser.get(answer["Location"])
    assert any(m.startswith("Stock below reserved: ") for m in messages_of(page)), messages_of(page)
    assert form_key(page) != key
    assert counters(stock) == (5, 2)
    assert not LogEntry.objects.exists()  # the history entry rolled back with the refusal


def test_an_invalid_form_is_shown_again_and_claims_nothing(admin_browser, stock):
    key = form_key(admin_browser.get(adjust_url(stock)))
    body = {"idempotency_key": key, "mode": "set", "quantity": "-1", "reason": "x"}
    page = admin_browser.post(adjust_url(stock), body)
    assert page.status_code == 200 and b"On hand cannot be negative." in page.content
    assert not IdempotencyKey.objects.filter(key=key).exists()
    assert counters(stock) == (5, 2)


def test_view_only_staff_get_403_and_nothing_changes(viewer, admin_browser, stock):
    key = form_key(admin_browser.get(adjust_url(stock)))
    assert viewer.get(adjust_url(stock)).status_code == 403
    body = {"idempotency_key": key, "mode": "delta", "quantity": "1", "reason": "x"}
    assert viewer.post(adjust_url(stock), body).status_code == 403
    assert counters(stock) == (5, 2)
    page = viewer.get(f"/admin/inventory/stockitem/{stock.pk}/change/")
    assert page.status_code == 200 and b"adjust-stock" not in page.content


def test_stock_and_product_pages_link_to_the_form(admin_browser, stock):
    for url in (
        f"/admin/inventory/stockitem/{stock.pk}/change/",
        f"/admin/inventory/product/{stock.product.pk}/change/",
    ):
        assert adjust_url(stock).encode() in admin_browser.get(url).content


def test_product_currency_is_a_choice_of_the_shops(admin_browser, settings):
    add = "/admin/inventory/product/add/"
    page = admin_browser.get(add)
    assert b'<select name="currency"' in page.content
    refused = admin_browser.post(
        add, {"sku": "CAP", "name": "Cap", "price": "5.00", "currency": "usd", **stock_inline()}
    )
    assert refused.status_code == 200 and refused.context["adminform"].form.errors["currency"]
    assert not Product.objects.filter(sku="CAP").exists()
    made = admin_browser.post(
        add,
        {"sku": "CAP", "name": "Cap", "price": "5.00", "currency": settings.SHOP_CURRENCY}
        | stock_inline(),
    )
    assert made.status_code == 302, made.context["adminform"].form.errors
    assert Product.objects.get(sku="CAP").currency == settings.SHOP_CURRENCY


def stock_inline() -> dict[str, str]:
    return {
        "stock-TOTAL_FORMS": "1",
        "stock-INITIAL_FORMS": "0",
        "stock-MIN_NUM_FORMS": "0",
        "stock-MAX_NUM_FORMS": "1",
    }
