"""The order body's `cancellation: {status, steps}` while it is `cancelling`; null otherwise."""

from __future__ import annotations

import pytest
from celery import current_app

from orders.compensation import steps_retry_failed
from payments.models import Refund
from payments.refund_decisions import refund_record_outside
from tests.orders.compensation_support import drive, paid_order, steps_of

pytestmark = pytest.mark.django_db(transaction=True)

CANCEL = "/api/v1/orders/{}/cancel/"
ORDER = "/api/v1/orders/{}/"
STEPS = ["restock", "refund", "history", "loyalty", "notify"]


@pytest.fixture(autouse=True)
def bells(monkeypatch, settings):
    settings.COMPENSATION_BACKOFF_BASE = 0.01
    settings.COMPENSATION_BACKOFF_MAX = 0.05
    settings.COMPENSATION_WAIT_SECONDS = 0.01
    monkeypatch.setattr(current_app, "send_task", lambda *a, **kw: None)


def test_a_cancelling_order_shows_its_cancellation_until_it_is_cancelled(
    provider, make_product, shopper_client
):
    make_product("TEE-M", price="10.00", stock=10)
    order = paid_order(shopper_client, {"TEE-M": 2})
    assert shopper_client.get(ORDER.format(order.id)).json()["cancellation"] is None
    started = shopper_client.post(CANCEL.format(order.id), HTTP_IDEMPOTENCY_KEY="c1")
    assert started.status_code == 202
    assert started.json()["cancellation"] == {
        "status": "processing",
        "steps": [
            {"name": name, "status": "pending", "attempts": 0, "last_error": None} for name in STEPS
        ],
    }
    provider.faults(decline_refunds=True)
    drive(order=order, kind="cancellation")
    body = shopper_client.get(ORDER.format(order.id)).json()
    assert body["status"] == "cancelling"
    cancellation = body["cancellation"]
    assert cancellation["status"] == "needs_attention"
    steps = {step["name"]: step for step in cancellation["steps"]}
    assert steps["restock"]["status"] == "done"
    assert steps["refund"]["status"] == "failed" and steps["refund"]["last_error"]
    # Listed the same way.
    listed = shopper_client.get("/api/v1/orders/").json()["results"][0]
    assert listed["cancellation"] == cancellation
    # Staff end it: the money went back outside the shop, then the failed step is retried.
    provider.faults(decline_refunds=False)
    assert refund_record_outside(refund_id=Refund.objects.get().id)
    steps_retry_failed(step_ids=[steps_of(order=order, name="refund").get().id])
    assert shopper_client.get(ORDER.format(order.id)).json()["cancellation"]["status"] == (
        "processing"
    )
    drive(order=order, kind="cancellation")
    body = shopper_client.get(ORDER.format(order.id)).json()
    assert body["status"] == "cancelled" and body["cancellation"] is None
    assert body["payment"]["status"] == "refunded"


def test_the_schema_documents_the_cancellation(api_client):
    schema = api_client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    components = schema["components"]["schemas"]
    order = next(
        body
        for body in components.values()
        if "reservation_expires_at" in body.get("properties", {})
    )
    cancellation = order["properties"]["cancellation"]
    assert cancellation.get("nullable") is True
    assert "cancellation" in order["required"]
    ref = cancellation.get("$ref") or cancellation["allOf"][0]["$ref"]
    body = components[ref.rsplit("/", 1)[-1]]
    assert set(body["properties"]) == {"status", "steps"}
    status = body["properties"]["status"]
    if "$ref" in status:
        status = components[status["$ref"].rsplit("/", 1)[-1]]
    assert status["enum"] == ["processing", "completed", "needs_attention"]
    step = components[body["properties"]["steps"]["items"]["$ref"].rsplit("/", 1)[-1]]
    assert set(step["properties"]) == {"name", "status", "attempts", "last_error"}
