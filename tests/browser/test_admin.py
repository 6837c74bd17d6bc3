"""Staff in Django's admin, in a real browser: each action is safe to double-click
and to send from two tabs ("Staff in the admin" in the HTTP contract).

Orders are placed through the live server's API (the storefront is covered in
test_storefront.py). The live shop's Celery worker runs the compensation steps
and the refunds; each refund at the provider is counted in its ledger.
"""

from __future__ import annotations

import re
import uuid

import pytest
import requests
from django.apps import apps
from django.test import Client

from core.api_tokens import api_token_issue
from orders.models import CompensationStep, Order, ReturnRequest
from payments.models import Refund
from tests.browser import ui
from tests.support.servers import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ADDRESS = {
    "name": "Ada Lovelace",
    "line1": "1 Analytical Way",
    "city": "London",
    "postal_code": "N1 9GU",
    "country": "GB",
}


def place_order_by_api(shop, user, lines: dict[str, int]) -> Order:
    token = api_token_issue(user=user).key
    response = requests.post(
        f"{shop.url}/api/v1/orders/",
        json={
            "lines": [{"sku": sku, "quantity": q} for sku, q in lines.items()],
            "on_shortage": "reject",
            "payment_method": "pm_card_ok",
            "shipping_address": ADDRESS,
        },
        headers={"Authorization": f"Token {token}", "Idempotency-Key": str(uuid.uuid4())},
        timeout=60,
    )
    assert response.status_code == 201, response.text
    return Order.objects.get(id=response.json()["id"])


def refunds_at_provider(shop, order: Order) -> list[dict]:
    """Succeeded refunds at the provider whose capture was this order's."""
    captures = {op["key"] for op in shop.charges(order.number)}
    return [
        op
        for op in shop.simulator.ledger()
        if op["kind"] == "refund" and op["status"] == "succeeded" and op["parent_key"] in captures
    ]


def test_staff_log_in_to_the_admin_and_see_an_order(
    shop, page, staff_user, make_user, make_product
):
    make_product("MUG", price="8.50", stock=5)
    order = place_order_by_api(shop, make_user(), {"MUG": 1})
    ui.staff_login(page, staff_user.username, password=staff_user.plain_password)
    ui.screenshot(page, "admin-index")
    ui.visit(page, f"/admin/orders/order/{order.id}/change/")
    assert str(order.number) in page.locator("body").inner_text()
    ui.screenshot(page, "admin-order")


def test_return_requested_in_the_storefront_and_marked_received_twice_is_refunded_once(
    shop, new_context, staff_user, make_product
):
    from orders.shipments import shipment_create

    make_product("MUG", price="8.50", stock=5, name="Enamel mug")
    shopper = new_context(shop).new_page()
    username = ui.signup(shopper)
    owner = apps.get_model("auth", "User").objects.get(username=username)
    order = place_order_by_api(shop, owner, {"MUG": 2})
    shipment_create(order_id=order.id, lines=None, carrier="dhl", tracking_number="T1")

    ui.visit(shopper, f"/orders/{order.id}/return/")
    shopper.get_by_label("Quantity", exact=True).first.fill("1")
    shopper.get_by_label("Reason", exact=True).fill("Too small")
    shopper.get_by_role("button", name="Request return").dblclick()
    shopper.wait_for_url(re.compile(rf"/orders/{order.id}/$"))
    (requested,) = ReturnRequest.objects.filter(order=order)
    assert requested.status == "requested"
    assert "Requested" in shopper.locator("body").inner_text()

    staff = new_context(shop).new_page()
    ui.staff_login(staff, staff_user.username, password=staff_user.plain_password)
    ui.visit(staff, "/admin/orders/returnrequest/")
    assert str(requested.pk) in staff.locator("body").inner_text()
    ui.check_page(staff, "admin-returns")
    ui.visit(staff, f"/admin/orders/returnrequest/{requested.pk}/change/")
    staff.get_by_role("button", name="Mark received").dblclick()
    staff.wait_for_url(re.compile(rf"/admin/orders/returnrequest/{requested.pk}/change/$"))

    wait_until(
        lambda: ReturnRequest.objects.get(pk=requested.pk).status == "completed",
        timeout=60,
        message="the compensation run to complete",
    )
    # One run: one set of steps, each done once; one refund at the provider.
    steps = CompensationStep.objects.filter(order_return=requested)
    assert sorted(steps.values_list("name", flat=True)) == sorted(
        ["restock", "refund", "history", "loyalty", "notify"]
    )
    assert set(steps.values_list("status", flat=True)) == {"done"}
    assert Refund.objects.filter(payment_id=order.payment_id).count() == 1
    assert len(refunds_at_provider(shop, order)) == 1
    ui.visit(staff, f"/admin/orders/returnrequest/{requested.pk}/change/")
    ui.screenshot(staff, "admin-return")

    ui.visit(shopper, f"/orders/{order.id}/")
    text = shopper.locator("body").inner_text()
    assert "Completed: refunded" in text, text
    assert re.search(r"€8\.50\s+Refunded\s+Return", text), text
    ui.check_page(shopper, "order-with-return")


def test_staff_refund_sent_from_two_tabs_refunds_once(
    shop, context, staff_user, make_user, make_product
):
    make_product("MUG", price="8.50", stock=5)
    order = place_order_by_api(shop, make_user(), {"MUG": 2})
    tabs = [context.new_page(), context.new_page()]
    ui.staff_login(tabs[0], staff_user.username, password=staff_user.plain_password)
    for tab in tabs:
        # The changelist's "Refund" action on this one order leads to its form.
        ui.visit(tab, "/admin/orders/order/")
        tab.locator(f'input[name="_selected_action"][value="{order.pk}"]').check()
        ui.fill_field(tab.get_by_role("combobox", name="Action"), "refund")
        tab.get_by_role("button", name="Go").click()
        tab.wait_for_load_state()
        tab.get_by_label("Amount").fill("5.00")
        tab.get_by_label("Reason").fill("goodwill: late delivery")
    for tab in tabs:
        tab.get_by_role("button", name="Refund").click()
        tab.wait_for_load_state()
    ui.screenshot(tabs[1], "admin-refund")

    wait_until(
        lambda: Refund.objects.filter(status="succeeded").exists(),
        timeout=60,
        message="the refund task to succeed",
    )
    assert Refund.objects.count() == 1, list(Refund.objects.values())
    assert len(refunds_at_provider(shop, order)) == 1


@pytest.mark.parametrize("path", ["/admin/login/", "/admin/inventory/product/add/"])
def test_admin_post_without_csrf_token_is_refused(make_user, path):
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user(staff=True))
    response = client.post(path, {"sku": "X", "name": "X", "price": "1.00"})
    assert response.status_code == 403, (response.status_code, response.content[:300])
