"""No secret in the logs of a whole keyed checkout, a staff refund and a webhook delivery.

Every logger at DEBUG, seen two ways: pytest's caplog (the records' messages
and every attribute a handler other than ours could read) and the shop's
JSON formatter's output. Neither may contain a token, a password, a session
cookie, a whole request key, the webhook secret, a signature, or anything
shaped like a card number. The payment method name (`pm_card_ok`) is allowed.
tests/core/test_logging.py holds the formatter's unit tests and the
checkout-only version of this test.
"""

from __future__ import annotations

import io
import json
import logging
import re
import uuid

import pytest
from django.conf import settings
from django.test import Client
from rest_framework.test import APIClient

from core.api_tokens import api_token_issue
from core.logging import JsonFormatter, key_hash
from orders.models import Order
from payments.models import Refund
from payments.refunds import refund_run
from tests.payments.refund_support import refund_event
from tests.security.conftest import ADDRESS

PASSWORD = "correct horse battery"  # tests.conftest.make_user's
# 13-19 digits, maybe grouped by spaces or dashes; not the decimals of a float.
# Not inside a run of hex digits and hyphens: a UUID's groups can be all digits
# ("…-3565-4777-8220-21967…") and are ids, not cards.
CARD_LIKE = re.compile(r"(?<![0-9A-Fa-f.-])(?:[0-9][ -]?){12,18}[0-9](?![0-9A-Fa-f-])")
# LogRecord's own bookkeeping (thread ids, clocks): numbers, never data.
_BOOKKEEPING = {"msg", "args", "exc_info", "exc_text", "stack_info", "thread", "process",
                "created", "msecs", "relativeCreated", "lineno"}  # fmt: skip


@pytest.fixture
def provider(tmp_path, settings):
    from tests.support.simulator import Simulator

    simulator = Simulator(tmp_path).start()
    settings.PAYMENTS_PROVIDER_URL = simulator.url
    settings.PAYMENTS_PROVIDER_TIMEOUT = 1.0
    yield simulator
    simulator.stop()


@pytest.fixture
def json_lines():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.setLevel(logging.DEBUG)
    root = logging.getLogger()
    root.addHandler(handler)
    yield stream
    root.removeHandler(handler)


def _record_text(record: logging.LogRecord) -> str:
    """All a handler could write of a record: its message, arguments, extras, traceback."""
    parts = [record.getMessage(), record.exc_text or ""]
    for name, value in vars(record).items():
        if name not in _BOOKKEEPING:
            parts.append(f"{name}={value!r}")
    return "\n".join(parts)


@pytest.mark.django_db(transaction=True)
def test_checkout_refund_and_webhook_leave_no_secret_in_any_log(
    caplog, json_lines, provider, make_product, make_user, client_for
):
    caplog.set_level(logging.DEBUG)  # the root logger: every logger propagates here
    make_product("TEE-M", price="10.00", stock=5)
    shopper = make_user()
    token = api_token_issue(user=shopper).key
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    checkout_key = f"checkout-{uuid.uuid4().hex}"
    body = {
        "lines": [{"sku": "TEE-M", "quantity": 2}],
        "on_shortage": "reject",
        "payment_method": "pm_card_ok",
        "shipping_address": ADDRESS,
    }
    placed = api.post("/api/v1/orders/", body, format="json", HTTP_IDEMPOTENCY_KEY=checkout_key)
    assert placed.status_code == 201, placed.content
    again = api.post("/api/v1/orders/", body, format="json", HTTP_IDEMPOTENCY_KEY=checkout_key)
    assert again["Idempotent-Replayed"] == "true"
    # A card number typed where a payment method goes is refused, and not logged.
    card = "4242 4242 4242 4242"
    refused = api.post(
        "/api/v1/orders/",
        {**body, "payment_method": card},
        format="json",
        HTTP_IDEMPOTENCY_KEY=f"card-{uuid.uuid4().hex}",
    )
    assert refused.status_code == 400
    # Logging in, by the API and by the storefront's form.
    login = APIClient().post(
        "/api/v1/auth/token/", {"username": shopper.username, "password": PASSWORD}, format="json"
    )
    logged_in_token = login.json()["token"]  # a new token: each log-in is its own
    browser = Client()
    assert browser.post(
        "/accounts/login/", {"username": shopper.username, "password": PASSWORD}
    ).status_code == 303  # fmt: skip
    session_cookie = browser.cookies["sessionid"].value

    # The staff refund, its task's body, and the provider's webhook for it.
    staff = client_for(make_user(actions=True))
    staff_token = staff._credentials["HTTP_AUTHORIZATION"].split()[1]
    order = Order.objects.get(id=placed.json()["id"])
    refund_key = f"refund-{uuid.uuid4().hex}"
    refunded = staff.post(
        f"/api/v1/orders/{order.id}/refunds/",
        {"amount": "5.00", "currency": "EUR", "reason": "goodwill"},
        format="json",
        HTTP_IDEMPOTENCY_KEY=refund_key,
    )
    assert refunded.status_code == 201, refunded.content
    refund_run(refund_id=refunded.json()["id"])
    refund = Refund.objects.get(id=refunded.json()["id"])
    event_body, signature = refund_event(key=refund.provider_key, amount="5.00")
    delivered = Client().post(
        "/api/v1/payments/webhooks/",
        data=event_body,
        content_type="application/json",
        HTTP_SHOP_SIGNATURE=signature,
    )
    assert delivered.status_code == 200, delivered.content
    forged = Client().post(
        "/api/v1/payments/webhooks/",
        data=event_body,
        content_type="application/json",
        HTTP_SHOP_SIGNATURE=signature[:-4] + "0000",
    )
    assert forged.status_code == 400

    json_output = json_lines.getvalue()
    records = "\n".join(_record_text(r) for r in caplog.records)
    assert len(caplog.records) > 10 and json_output.count("\n") > 10  # the logs were seen
    secrets = {
        "shopper token": token,
        "logged-in token": logged_in_token,
        "staff token": staff_token,
        "password": PASSWORD,
        "session cookie": session_cookie,
        "checkout key": checkout_key,
        "refund key": refund_key,
        "webhook secret": settings.PAYMENTS_WEBHOOK_SECRET,
        "signature": signature.split("v1=")[1],
        "card": card,
    }
    for where, text in (("records", records), ("json", json_output)):
        for name, secret in secrets.items():
            assert secret not in text, f"{name} in the {where} logs"
        cards = CARD_LIKE.findall(text)
        assert cards == [], f"card-like numbers in the {where} logs: {cards}"
    # What is logged instead: the keys' hashes, the method's name.
    for key in (checkout_key, refund_key):
        assert key_hash(key) in json_output
    parsed = [json.loads(line) for line in json_output.splitlines()]
    assert {r.get("event") for r in parsed} >= {"request", "duplicate_suppressed"}
