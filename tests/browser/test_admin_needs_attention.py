"""The admin's "Needs attention" page in a real browser: reached from the index by its
count, looked at (screenshots at desktop and phone width, axe), and one of its keyed
actions double-clicked: the item ends once."""

from __future__ import annotations

import re

import pytest

from payments.models import Payment, Refund
from tests.backoffice.attention_support import (
    captured_payment,
    every_kind,
    flagged_refund,
    order_of,
)
from tests.browser import ui

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def live_shop(django_db_setup, tmp_path_factory):
    # No worker: the listed items stay as they are while the page is looked at.
    with ui.live_shop_running(tmp_path_factory.mktemp("live-shop"), worker=False) as shop:
        yield shop


def test_needs_attention_from_the_index_screenshots_and_a_double_clicked_action(
    shop, page, staff_user, make_user
):
    items = every_kind(make_user())
    other = order_of(captured_payment(), make_user())
    second = flagged_refund(other.payment, amount="2.50")
    ui.staff_login(page, staff_user.username, password=staff_user.plain_password)
    ui.visit(page, "/admin/")
    link = page.get_by_role("link", name="Needs attention")
    assert page.locator(".needs-attention-count").inner_text() == "5"
    ui.screenshot(page, "admin-index-needs-attention")
    link.click()
    page.wait_for_load_state()
    body = page.locator("body").inner_text()
    assert f"order {items['order'].number}" in body
    assert "card_closed" in body and "SMTP refused" in body
    ui.check_page(page, "admin-needs-attention")

    # A double click on "Refunded outside the shop" of one refund: recorded once.
    row = page.locator(f'tr[data-kind="refund"][data-pk="{second.pk}"]')
    row.get_by_role("button", name="Refunded outside the shop").dblclick()
    page.wait_for_load_state()
    page.locator(".messagelist").wait_for()
    assert re.search(r"Refunded outside the shop: done", page.locator(".messagelist").inner_text())
    assert Refund.objects.get(pk=second.pk).status == "succeeded"
    assert Payment.objects.get(pk=second.payment_id).amount_refunded == second.amount  # once
    assert page.locator(f'tr[data-kind="refund"][data-pk="{second.pk}"]').count() == 0
    ui.check_page(page, "admin-needs-attention-after-action")
