"""Each form key's business scope outlives its request key (docs/idempotency.md,
"Business scopes that outlive request keys").

Every test sends a form, purges the request keys at retention 0 (the key row
is gone, as after `IDEMPOTENCY_KEY_RETENTION`), then sends the same form again:
the database answers the object the form made (the same 303 as a replay)
and nothing happens a second time. The twins call the same service without
the form's scope, as every form did before: the second send acts again.
"""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from celery import current_app
from django.test import Client
from django.urls import reverse

from idempotency.keys import keys_purge
from idempotency.models import IdempotencyKey
from inventory.models import StockAdjustment, StockItem
from inventory.services import stock_adjust_by_staff
from orders import shipments
from orders.models import Order, ReturnRequest, Shipment
from orders.returns import ReturnLineRequest, return_request
from payments.models import Refund
from tests.orders.shipping import confirm
from tests.shop.conftest import add_to_cart, browser, checkout_form, order_id_of  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def quiet_bells(monkeypatch):
    monkeypatch.setattr(current_app, "send_task", lambda *a, **kw: None)


def staff_browser(make_user) -> Client:
    user = make_user(staff=True)
    user.is_superuser = True
    user.save(update_fields=["is_superuser"])
    client = Client()
    client.force_login(user)
    client.user = user
    return client


@pytest.fixture
def staff(make_user) -> Client:
    return staff_browser(make_user)


def form_key(page) -> str:
    assert page.status_code == 200, page.status_code
    return re.search(r'name="idempotency_key" value="([^"]+)"', page.content.decode())[1]


def purge_keys() -> None:
    """Every finished request key goes, as after its retention."""
    keys_purge(retention=0)
    assert not IdempotencyKey.objects.filter(recovery_point="finished").exists()


def test_a_shipment_form_sent_after_its_key_was_purged_ships_once(staff, make_product, reserve):
    make_product("TEE-M", price="19.99", stock=10)
    order = confirm(reserve({"TEE-M": 3}))
    url = f"/admin/orders/order/{order.pk}/ship/"
    body = {"idempotency_key": form_key(staff.get(url)), "ship-TEE-M": "1", "carrier": "dhl"}
    first = staff.post(url, body)
    purge_keys()
    again = staff.post(url, body)
    assert first.status_code == again.status_code == 303
    assert again["Location"] == first["Location"]
    assert "Idempotent-Replayed" not in again  # the key was gone: the shipment answered
    (shipment,) = Shipment.objects.filter(order=order)
    assert shipment.form_scope == f"{staff.user.pk}:{body['idempotency_key']}"
    assert order.lines.get().quantity_shipped == 1


def test_twin_a_shipment_without_its_scope_ships_again(make_product, reserve):
    make_product("TEE-M", price="19.99", stock=10)
    order = confirm(reserve({"TEE-M": 3}))
    for _ in range(2):
        shipments.shipment_create(
            order_id=order.id,
            lines=[shipments.ShipmentLineRequest(sku="TEE-M", quantity=1)],
            carrier="dhl",
            tracking_number=None,
        )
    assert Shipment.objects.filter(order=order).count() == 2


def test_a_stock_form_sent_after_its_key_was_purged_adjusts_once(staff, make_product):
    make_product("TEE-M", price="19.99", stock=10)
    stock = StockItem.objects.get(product__sku="TEE-M")
    url = reverse("admin:inventory_stockitem_adjust", args=[stock.pk])
    body = {
        "idempotency_key": form_key(staff.get(url)),
        "mode": "delta",
        "quantity": "5",
        "reason": "delivery",
    }
    first = staff.post(url, body)
    purge_keys()
    again = staff.post(url, body)
    assert first.status_code == again.status_code == 303
    assert again["Location"] == first["Location"]
    stock.refresh_from_db()
    assert stock.on_hand == 15
    (made,) = StockAdjustment.objects.all()
    assert (made.delta, made.form_scope) == (5, f"{staff.user.pk}:{body['idempotency_key']}")


def test_two_staff_sending_the_same_stock_form_adjust_once_each(staff, make_user, make_product):
    """The scope is the key's: its owner and the key. Two people, two decisions (as before)."""
    make_product("TEE-M", price="19.99", stock=10)
    stock = StockItem.objects.get(product__sku="TEE-M")
    url = reverse("admin:inventory_stockitem_adjust", args=[stock.pk])
    other = staff_browser(make_user)
    key = form_key(staff.get(url))
    assert form_key(other.get(url)) == key  # the same form shown to both
    body = {"idempotency_key": key, "mode": "delta", "quantity": "5", "reason": "delivery"}
    assert staff.post(url, body).status_code == other.post(url, body).status_code == 303
    stock.refresh_from_db()
    assert stock.on_hand == 20 and StockAdjustment.objects.count() == 2


def test_twin_a_stock_adjustment_without_its_scope_adjusts_again(make_user, make_product):
    make_product("TEE-M", price="19.99", stock=10)
    by = make_user(staff=True)
    for _ in range(2):
        stock_adjust_by_staff(sku="TEE-M", delta=5, set_to=None, reason="delivery", by=by)
    assert StockItem.objects.get(product__sku="TEE-M").on_hand == 20


def test_a_refund_form_sent_after_its_key_was_purged_refunds_once(
    staff, provider, make_product, shopper_client
):
    from tests.orders.conftest import ADDRESS

    make_product("TEE-M", price="10.00", stock=10)
    response = shopper_client.post(
        "/api/v1/orders/",
        {
            "lines": [{"sku": "TEE-M", "quantity": 2}],
            "payment_method": "pm_card_ok",
            "shipping_address": ADDRESS,
        },
        format="json",
        HTTP_IDEMPOTENCY_KEY="order-1",
    )
    order = Order.objects.get(id=response.json()["id"])
    url = reverse("admin:orders_order_refund", args=[order.pk])
    body = {"amount": "6.00", "reason": "scratched", "idempotency_key": form_key(staff.get(url))}
    first = staff.post(url, body)
    purge_keys()
    again = staff.post(url, body)
    order_page = reverse("admin:orders_order_change", args=[order.pk])
    assert [(a.status_code, a["Location"]) for a in (first, again)] == [(303, order_page)] * 2
    (refund,) = Refund.objects.all()
    assert refund.amount == Decimal("6.00")
    order.payment.refresh_from_db()
    assert order.payment.refund_reserved == Decimal("6.00")


def test_a_return_form_sent_after_its_key_was_purged_returns_once(
    browser,  # noqa: F811
    make_product,
    provider,
):
    make_product("TEE-M", price="19.99", stock=8)
    add_to_cart(browser, "TEE-M", 2)
    order = Order.objects.get(id=order_id_of(browser.post("/checkout/", checkout_form(browser))))
    shipments.shipment_create(order_id=order.id, lines=None, carrier="dhl", tracking_number="T1")
    html = browser.get(f"/orders/{order.id}/return/").content.decode()
    line = order.lines.get()
    form = {
        "idempotency_key": re.search(r'name="idempotency_key" value="([^"]+)"', html)[1],
        "reason": "too small",
        f"quantity_{line.id}": "1",
    }
    first = browser.post(f"/orders/{order.id}/return/", form)
    purge_keys()
    again = browser.post(f"/orders/{order.id}/return/", form)
    assert first.status_code == again.status_code == 303
    assert first["Location"] == again["Location"] == f"/orders/{order.id}/"
    (made,) = ReturnRequest.objects.filter(order=order)
    assert made.form_scope == f"{browser.user.pk}:{form['idempotency_key']}"


def test_twin_a_return_without_its_scope_returns_again(make_product, reserve):
    make_product("TEE-M", price="19.99", stock=8)
    order = confirm(reserve({"TEE-M": 2}))
    shipments.shipment_create(order_id=order.id, lines=None, carrier=None, tracking_number=None)
    for _ in range(2):
        return_request(
            order_id=order.id, lines=[ReturnLineRequest(sku="TEE-M", quantity=1)], reason="x"
        )
    assert ReturnRequest.objects.filter(order=order).count() == 2
