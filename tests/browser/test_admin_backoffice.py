"""The back office in a real browser: ship, adjust stock, refund and cancel from the admin.

Each new page is screenshotted (var/screenshots/admin-*.png) and checked with
axe; each form is double-clicked and still changes once.
"""

from __future__ import annotations

import re
import uuid

import pytest
import requests

from core.api_tokens import api_token_issue
from inventory.models import StockItem
from orders.models import Order, ReturnRequest, Shipment
from payments.models import Refund
from tests.browser import ui
from tests.browser.test_admin import place_order_by_api
from tests.support.servers import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_staff_ship_adjust_refund_cancel_and_export_in_the_admin(
    shop, page, staff_user, make_user, make_product
):
    make_product("MUG", price="8.50", stock=5, name="Enamel mug")
    make_product("TEE-M", price="19.99", stock=5, name="T-shirt")
    shopper = make_user()
    order = place_order_by_api(shop, shopper, {"MUG": 2, "TEE-M": 1})
    ui.staff_login(page, staff_user.username, password=staff_user.plain_password)

    # The order's own page: its buttons.
    ui.visit(page, f"/admin/orders/order/{order.id}/change/")
    for button in ("Create shipment", "Refund", "Cancel order"):
        assert page.get_by_role("link", name=button, exact=True).count() == 1, button
    ui.screenshot(page, "admin-order-buttons")

    # Create shipment: a refusal first (more than unshipped), shown as a message.
    page.get_by_role("link", name="Create shipment").click()
    page.wait_for_url(re.compile(rf"/admin/orders/order/{order.id}/ship/"))
    ui.check_page(page, "admin-shipment-form")
    page.locator('input[name="ship-MUG"]').fill("5")
    page.get_by_role("button", name="Create shipment").click()
    page.wait_for_load_state()
    assert "Exceeds unshipped:" in page.locator(".messagelist").inner_text()
    ui.check_page(page, "admin-shipment-refused")
    page.locator('input[name="ship-MUG"]').fill("2")
    page.locator('input[name="ship-TEE-M"]').fill("0")
    page.get_by_label("Carrier").fill("dhl")
    page.get_by_label("Tracking number").fill("TRK-42")
    ui.double_click_keyed(
        page,
        page.get_by_role("button", name="Create shipment"),
        done=re.compile(rf"/admin/orders/order/{order.id}/change/$"),
    )
    (shipment,) = Shipment.objects.filter(order=order)
    assert shipment.tracking_number == "TRK-42"
    assert "created" in page.locator(".messagelist").inner_text()

    # Adjust stock from the stock item's page.
    stock = StockItem.objects.get(product__sku="MUG")
    before = stock.on_hand
    ui.visit(page, f"/admin/inventory/stockitem/{stock.pk}/change/")
    page.get_by_role("link", name="Adjust stock").click()
    page.wait_for_url(re.compile(rf"/admin/inventory/stockitem/{stock.pk}/adjust/"))
    ui.check_page(page, "admin-stock-adjust")
    page.get_by_label("Change by (delta, e.g. -2 or 10)").check()
    page.get_by_label("Quantity").fill("3")
    page.get_by_label("Reason").fill("delivery from the supplier")
    ui.double_click_keyed(
        page,
        page.get_by_role("button", name="Adjust stock"),
        done=re.compile(rf"/admin/inventory/stockitem/{stock.pk}/change/$"),
    )
    assert StockItem.objects.get(pk=stock.pk).on_hand == before + 3

    # Refund from the order's page: its page says what is still refundable.
    ui.visit(page, f"/admin/orders/order/{order.id}/change/")
    page.get_by_role("link", name="Refund", exact=True).click()
    page.wait_for_url(re.compile(rf"/admin/orders/order/{order.id}/refund/"))
    assert "still refundable" in page.locator("body").inner_text()
    ui.check_page(page, "admin-order-refund")
    page.get_by_label("Amount").fill("1.00")
    page.get_by_label("Reason").fill("goodwill: dented mug")
    ui.double_click_keyed(
        page,
        page.get_by_role("button", name="Refund", exact=True),
        done=re.compile(rf"/admin/orders/order/{order.id}/change/$"),
    )
    wait_until(
        lambda: Refund.objects.filter(status="succeeded").exists(),
        timeout=60,
        message="the refund task to succeed",
    )
    assert Refund.objects.filter(payment_id=order.payment_id).count() == 1

    # Cancel another order from its page, after its confirmation page.
    other = place_order_by_api(shop, shopper, {"TEE-M": 1})
    ui.visit(page, f"/admin/orders/order/{other.id}/change/")
    page.get_by_role("link", name="Cancel order").click()
    page.wait_for_url(re.compile(rf"/admin/orders/order/{other.id}/cancel-order/"))
    assert "moves to cancelling" in page.locator("body").inner_text()
    ui.check_page(page, "admin-order-cancel")
    ui.double_click_keyed(
        page,
        page.get_by_role("button", name="Cancel order"),
        done=re.compile(rf"/admin/orders/order/{other.id}/change/$"),
    )
    assert Order.objects.get(id=other.id).status in ("cancelling", "cancelled")
    assert Order.objects.get(id=other.id).events.filter(kind="cancellation_started").count() == 1

    # The orders' list with its CSV export.
    ui.visit(page, "/admin/orders/order/")
    # No axe here: Django's search box with a help text (OrderAdmin.search_help_text, not new)
    # is labelled by its image only (axe label-title-only).
    ui.check_page(page, "admin-orders-export", axe=False)
    export = page.request.get(page.get_by_role("link", name="Export CSV").get_attribute("href"))
    assert export.status == 200 and export.headers["content-type"].startswith("text/csv")
    text = export.text()
    assert str(order.number) in text and str(other.number) in text

    # Bulk "Mark received": the returns' changelist action asks first, then receives once.
    token = api_token_issue(user=shopper).key
    asked = requests.post(
        f"{shop.url}/api/v1/orders/{order.id}/returns/",
        json={"lines": [{"sku": "MUG", "quantity": 1}], "reason": "chipped"},
        headers={"Authorization": f"Token {token}", "Idempotency-Key": str(uuid.uuid4())},
        timeout=60,
    )
    assert asked.status_code == 201, asked.text
    ui.visit(page, f"/admin/orders/returnrequest/?q={order.number}")
    page.locator('input[name="_selected_action"]').first.check()
    ui.fill_field(page.get_by_role("combobox", name="Action"), "mark_received")
    page.get_by_role("button", name="Go").click()
    page.wait_for_load_state()
    ui.check_page(page, "admin-returns-mark-received")
    page.get_by_role("button", name="Yes, mark received").dblclick()
    page.wait_for_url(re.compile(r"/admin/orders/returnrequest/$"))
    (order_return,) = ReturnRequest.objects.filter(order=order)
    assert order_return.status != "requested"
    assert order.events.filter(kind="return_received").count() == 1
