"""The storefront's return form: the API's keyed `return.create` under `shop.return.create`.

A double submit, a second tab of the same page and a refused-then-corrected
form each behave as the shopper expects: one return per intent, refusals shown
on the form in words (shop/returns.py).
"""

from __future__ import annotations

import re

import pytest
from celery import current_app
from django.db.models.functions import Now

from idempotency.models import IdempotencyKey
from orders import shipments
from orders.compensation import step_run
from orders.models import CompensationStep, Order, ReturnRequest
from orders.returns import return_receive
from payments.models import Refund
from payments.refunds import refund_run
from shop import returns as shop_returns
from tests.shop.conftest import add_to_cart, checkout_form, order_id_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def quiet_bells(monkeypatch):
    monkeypatch.setattr(current_app, "send_task", lambda *a, **kw: None)


@pytest.fixture
def catalog(make_product):
    make_product("TEE-M", price="19.99", stock=8, name="T-shirt, size M")
    make_product("MUG", price="12.50", stock=8, name="Enamel mug")


@pytest.fixture
def shipped(browser, catalog, provider) -> Order:
    add_to_cart(browser, "TEE-M", 2)
    add_to_cart(browser, "MUG", 1)
    order = Order.objects.get(id=order_id_of(browser.post("/checkout/", checkout_form(browser))))
    shipments.shipment_create(order_id=order.id, lines=None, carrier="dhl", tracking_number="T1")
    return order


def return_form(client, order, **quantities) -> dict:
    """The return page's form as a browser sends it: its key, a quantity per line, a reason."""
    html = client.get(f"/orders/{order.id}/return/").content.decode()
    data = {
        "idempotency_key": re.search(r'name="idempotency_key" value="([^"]+)"', html)[1],
        "reason": "too small",
    }
    for line in order.lines.all():
        field = f"quantity_{line.id}"
        assert f'name="{field}"' in html, field
        data[field] = str(quantities.get(line.sku, 0))
    return data


def test_the_form_sent_twice_is_one_return_and_the_same_redirect(browser, shipped):
    form = return_form(browser, shipped, **{"TEE-M": 1})
    first = browser.post(f"/orders/{shipped.id}/return/", form)
    again = browser.post(f"/orders/{shipped.id}/return/", form)
    assert first.status_code == again.status_code == 303
    assert first["Location"] == again["Location"] == f"/orders/{shipped.id}/"
    assert again["Idempotent-Replayed"] == "true"
    (made,) = ReturnRequest.objects.filter(order=shipped)
    assert [(line.sku, line.quantity) for line in made.lines.all()] == [("TEE-M", 1)]
    assert made.reason == "too small" and str(made.refund_amount) == "19.99"
    assert IdempotencyKey.objects.get(key=form["idempotency_key"]).operation == (
        shop_returns.CREATE
    )
    page = browser.get(first["Location"]).content.decode()
    assert "Returns" in page and "Requested: send the items back" in page
    assert "1 × T-shirt, size M" in page


def test_two_tabs_of_the_same_page_make_one_return(browser, shipped):
    tab_one = return_form(browser, shipped, **{"TEE-M": 2})
    tab_two = return_form(browser, shipped, **{"TEE-M": 2})
    assert tab_one["idempotency_key"] == tab_two["idempotency_key"]
    for form in (tab_one, tab_two):
        assert browser.post(f"/orders/{shipped.id}/return/", form).status_code == 303
    assert ReturnRequest.objects.filter(order=shipped).count() == 1
    # Once made, the page's key moves on: another return is a new request.
    assert return_form(browser, shipped)["idempotency_key"] != tab_one["idempotency_key"]


def test_more_than_returnable_is_refused_on_the_form_then_the_corrected_form_goes(browser, shipped):
    stale = return_form(browser, shipped, **{"TEE-M": 2})  # a tab left open
    made = browser.post(f"/orders/{shipped.id}/return/", return_form(browser, shipped, MUG=1))
    assert made.status_code == 303
    # Another tab, rendered before that return, asking for both T-shirts as well:
    stale["idempotency_key"] = shop_returns.return_form_key(shipped, after="another-render")
    browser.post(f"/orders/{shipped.id}/return/", return_form(browser, shipped, **{"TEE-M": 2}))
    refused = browser.post(f"/orders/{shipped.id}/return/", stale)
    assert refused.status_code == 303
    assert refused["Location"].startswith(
        f"/orders/{shipped.id}/return/?problem=return_exceeds_order"
    )
    page = browser.get(refused["Location"]).content.decode()
    assert "You asked to return more than was shipped" in page
    assert re.search(rf'name="{_field(shipped, "TEE-M")}" value="2"', page), "typed is kept"
    assert ReturnRequest.objects.filter(order=shipped).count() == 2
    assert "nothing more to send back" in page


def _field(order, sku: str) -> str:
    return f"quantity_{order.lines.get(sku=sku).id}"


def test_nothing_chosen_or_too_many_is_the_form_again_claiming_nothing(browser, shipped):
    form = return_form(browser, shipped)
    nothing = browser.post(f"/orders/{shipped.id}/return/", form)
    assert nothing.status_code == 400
    assert "at least one item" in nothing.content.decode()
    form[_field(shipped, "TEE-M")] = "5"
    too_many = browser.post(f"/orders/{shipped.id}/return/", form)
    assert too_many.status_code == 400 and "At most 2" in too_many.content.decode()
    assert 'aria-invalid="true"' in too_many.content.decode()
    assert not ReturnRequest.objects.exists()
    assert not IdempotencyKey.objects.filter(key=form["idempotency_key"]).exists()


def test_an_order_not_shipped_has_nothing_to_return(browser, catalog, provider):
    add_to_cart(browser, "TEE-M", 1)
    order_id = order_id_of(browser.post("/checkout/", checkout_form(browser)))
    page = browser.get(f"/orders/{order_id}/return/").content.decode()
    assert "nothing to send back" in page and "Request return" not in page


def test_the_order_page_shows_the_returns_steps_and_refund_in_words(browser, shipped):
    browser.post(f"/orders/{shipped.id}/return/", return_form(browser, shipped, MUG=1))
    made = ReturnRequest.objects.get(order=shipped)
    return_receive(return_id=made.id)
    for _ in range(6):  # play the worker: the steps, then the refund they asked for
        for step in CompensationStep.objects.filter(order_return=made, done_at__isnull=True):
            CompensationStep.objects.filter(id=step.id).update(next_attempt_at=Now())
            step_run(step_id=step.id)
        for refund in Refund.objects.filter(status="pending"):
            refund_run(refund_id=refund.id)
    page = browser.get(f"/orders/{shipped.id}/").content.decode()
    assert ReturnRequest.objects.get(id=made.id).status == "completed", page
    assert "Completed: refunded" in page
    assert "Items back in stock" in page and "Points adjusted" in page
    refunds = page[page.index("<h3>Refunds</h3>") :]
    assert re.search(r"€12\.50</strong>\s*<span[^>]*>Refunded</span>\s*Return\s", refunds)
    text = re.sub(r"<[^>]+>", " ", page)  # what the shopper reads: words, never the codes
    assert "needs_attention" not in text and "succeeded" not in text and "done" not in text
