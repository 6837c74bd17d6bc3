"""The keyed checkout apart from HTTP: one domain operation, each caller its own answer.

A storefront-like form view (not mounted: a plain function, as a later issue
will mount one) runs the very operation the API runs, under a request key,
with a presenter that redirects to the order page. The API's stored answer
is the contract's JSON, unchanged; the completer finishes each key with the
presenter declared for the key's operation.
"""

from __future__ import annotations

import ast
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.db.models.functions import Now
from django.test import RequestFactory

from idempotency.keys import (
    Reply,
    Result,
    answer_new,
    keyed_operation,
    keys_complete_abandoned,
    registered_presenter,
)
from idempotency.models import IdempotencyKey
from idempotency.views import REPLAYED_HEADER, idempotent_form
from inventory.models import StockItem
from orders import operations, selectors
from orders.api import presenters
from orders.api.serializers import order_body
from orders.models import Order
from tests.orders.conftest import ADDRESS, line_requests
from tests.support.simulator import settle_due

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]

# The storefront's own name for placing an order: its keys are completed with its presenter.
FORM_CREATE = "test.form.order.create"


@keyed_operation(FORM_CREATE, resume=operations.order_resume)
def order_redirect(result: Result) -> Reply:
    """The storefront's answer: 303 to the order page; a refusal with no order, back to the cart."""
    if result.value is not None:
        return Reply(status=303, headers={"Location": f"/orders/{result.value.id}/"})
    return Reply(status=303, headers={"Location": f"/cart/?problem={result.refusal.code}"})


@idempotent_form(operation=FORM_CREATE)
def place_order_form(request, *, key):
    """A checkout form's POST: validate the fields, then the same operation as the API."""
    lines = line_requests({request.POST["sku"]: int(request.POST["quantity"])})
    operations.order_place_keyed(
        run=key.claim(),
        present=order_redirect,
        user=request.user,
        lines=lines,
        on_shortage="reject",
        payment_method=request.POST["payment_method"],
        shipping_address=ADDRESS,
    )


@pytest.fixture
def catalog(make_product):
    make_product("TEE-M", price="19.99", stock=5)


@pytest.fixture
def submit(shopper):
    factory = RequestFactory()

    def post(key: str, *, quantity: int = 2, method: str = "pm_card_ok"):
        request = factory.post(
            "/checkout/",
            {
                "sku": "TEE-M",
                "quantity": str(quantity),
                "payment_method": method,
                "idempotency_key": key,
            },
        )
        request.user = shopper
        return place_order_form(request)

    return post


def api_place(client, key: str, *, quantity: int = 2, method: str = "pm_card_ok"):
    body = {
        "lines": [{"sku": "TEE-M", "quantity": quantity}],
        "payment_method": method,
        "shipping_address": ADDRESS,
    }
    return client.post("/api/v1/orders/", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def charges(provider, order):
    return [
        op
        for op in provider.ledger()
        if op["kind"] == "capture"
        and op["status"] == "succeeded"
        and op["key"].endswith(f":order-{order.number}:capture")
    ]


def test_a_form_gets_a_redirect_stored_with_the_order_and_replayed(submit, catalog, provider):
    key = uuid.uuid4().hex
    first = submit(key)
    order = Order.objects.get()
    assert order.status == "confirmed"
    assert first.status_code == 303 and first["Location"] == f"/orders/{order.id}/"
    assert REPLAYED_HEADER not in first and first.content == b""

    again = submit(key)
    assert again.status_code == 303 and again["Location"] == first["Location"]
    assert again[REPLAYED_HEADER] == "true"
    assert Order.objects.count() == 1 and len(charges(provider, order)) == 1
    assert StockItem.objects.get().on_hand == 3

    row = IdempotencyKey.objects.get(key=key)
    assert (row.operation, row.recovery_point) == (FORM_CREATE, "finished")
    assert (row.response_status, row.response_body) == (303, None)
    assert row.response_headers == {"Location": f"/orders/{order.id}/"}


def test_a_refusal_is_answered_by_the_callers_presenter(submit, catalog, provider):
    key = uuid.uuid4().hex
    first = submit(key, quantity=9)
    assert first.status_code == 303
    assert first["Location"] == "/cart/?problem=insufficient_stock"
    again = submit(key, quantity=9)
    assert again[REPLAYED_HEADER] == "true" and again["Location"] == first["Location"]
    assert not Order.objects.exists()
    assert (StockItem.objects.get().on_hand, StockItem.objects.get().reserved) == (5, 0)
    row = IdempotencyKey.objects.get(key=key)
    assert (row.response_status, row.response_body) == (303, None)


def test_the_api_answer_is_the_contracts_json_byte_for_byte(shopper_client, catalog, provider):
    response = api_place(shopper_client, "api-key")
    assert response.status_code == 201
    order = selectors.order_get(order_id=Order.objects.get().id)
    expected = answer_new(status=201, body=order_body(order))
    row = IdempotencyKey.objects.get(key="api-key")
    assert row.operation == operations.CREATE
    assert row.response_body == expected.body == response.content.decode()
    assert row.response_headers == expected.headers == {"Content-Type": "application/json"}


def test_the_completer_stores_each_callers_answer(
    submit, shopper_client, catalog, provider, settings
):
    """Two abandoned keys left open (payment unknown), one per caller: each completed
    with its own operation's presenter, never the other's."""
    form_key, api_key = uuid.uuid4().hex, uuid.uuid4().hex
    pending_form = submit(form_key, quantity=1, method="pm_card_timeout")
    assert pending_form.status_code == 303  # answered, not stored: the key stays open
    pending_api = api_place(shopper_client, api_key, quantity=1, method="pm_card_timeout")
    assert pending_api.status_code == 202
    assert set(IdempotencyKey.objects.values_list("recovery_point", flat=True)) == {
        operations.PAYMENT_UNKNOWN
    }
    for order in Order.objects.all():
        settle_due(order.payment)
    assert set(Order.objects.values_list("status", flat=True)) == {"confirmed"}

    settings.IDEMPOTENCY_ABANDON_AFTER = 0
    IdempotencyKey.objects.update(last_run_at=Now() - timedelta(seconds=1))
    assert keys_complete_abandoned() == 2

    form_row = IdempotencyKey.objects.get(key=form_key)
    form_order = Order.objects.get(id=pending_form["Location"].split("/")[2])
    assert (form_row.recovery_point, form_row.response_status) == ("finished", 303)
    assert form_row.response_headers == {"Location": f"/orders/{form_order.id}/"}
    replay = submit(form_key, quantity=1, method="pm_card_timeout")
    assert replay[REPLAYED_HEADER] == "true" and replay.status_code == 303

    api_row = IdempotencyKey.objects.get(key=api_key)
    api_order = selectors.order_get(order_id=pending_api.json()["id"])
    assert api_row.response_status == 201
    assert api_row.response_body == answer_new(status=201, body=order_body(api_order)).body
    replay = api_place(shopper_client, api_key, quantity=1, method="pm_card_timeout")
    assert replay.status_code == 201 and replay.content.decode() == api_row.response_body


def test_each_operation_is_registered_with_the_apis_presenter():
    assert registered_presenter(operations.CREATE) is presenters.order_created
    assert registered_presenter(operations.CONFIRM) is presenters.order_confirmed
    assert registered_presenter(operations.CANCEL) is presenters.order_cancelled


@pytest.mark.parametrize(
    "module",
    [
        "orders/operations.py",
        "orders/services.py",
        "orders/selectors.py",
        "inventory/operations.py",
        "inventory/services.py",
        "inventory/selectors.py",
    ],
)
def test_the_domain_does_not_import_the_api(module):
    """Dependencies go api → domain; only apps.py wires the API's presenters in."""
    tree = ast.parse((ROOT / module).read_text())
    imported = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imported.append("." * node.level + (node.module or ""))
            imported += [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
    assert not [name for name in imported if name.split(".")[-1] == "api" or ".api" in name]
