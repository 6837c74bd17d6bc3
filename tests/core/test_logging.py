"""Structured logs: one JSON line per event, the request's context, never a secret."""

from __future__ import annotations

import io
import json
import logging
import uuid

import pytest

from core.api_tokens import api_token_issue
from core.logging import JsonFormatter, TextFormatter, key_hash, log_context
from tests.orders.conftest import ADDRESS

PASSWORD = "correct horse battery"  # tests.conftest.make_user's password


@pytest.fixture
def lines():
    """Every log line of every logger, formatted by the shop's JSON formatter."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)

    def read() -> list[dict]:
        handler.flush()
        return [json.loads(line) for line in stream.getvalue().splitlines()]

    read.raw = lambda: stream.getvalue()  # type: ignore[attr-defined]
    yield read
    root.removeHandler(handler)
    root.setLevel(old_level)


@pytest.fixture
def provider(tmp_path, settings):
    from tests.support.simulator import Simulator

    simulator = Simulator(tmp_path).start()
    settings.PAYMENTS_PROVIDER_URL = simulator.url
    settings.PAYMENTS_PROVIDER_TIMEOUT = 1.0
    yield simulator
    simulator.stop()


@pytest.mark.django_db(transaction=True)
def test_keyed_checkout_logs_no_secret_and_the_key_hash(
    lines, provider, make_product, make_user, api_client
):
    make_product("TEE-M", price="19.99", stock=5)
    user = make_user()
    token = api_token_issue(user=user).key
    key = f"checkout-{uuid.uuid4().hex}"
    body = {
        "lines": [{"sku": "TEE-M", "quantity": 1}],
        "on_shortage": "reject",
        "payment_method": "pm_card_ok",
        "shipping_address": ADDRESS,
    }
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    headers = {"HTTP_IDEMPOTENCY_KEY": key, "HTTP_X_REQUEST_ID": "req-checkout-1"}
    first = api_client.post("/api/v1/orders/", body, format="json", **headers)
    assert first.status_code == 201, first.content
    assert first["X-Request-ID"] == "req-checkout-1"
    again = api_client.post("/api/v1/orders/", body, format="json", **headers)
    assert again["Idempotent-Replayed"] == "true"
    # A login with the password, logged like any request.
    assert api_client.post("/api/v1/auth/token/", {"username": user.username, "password": PASSWORD})

    raw = lines.raw()
    assert token not in raw
    assert PASSWORD not in raw
    assert key not in raw
    records = lines()
    hashed = [r for r in records if r.get("idempotency_key_hash") == key_hash(key)]
    requests = [r for r in hashed if r.get("event") == "request"]
    assert len(requests) == 2
    assert {r["request_id"] for r in requests} == {"req-checkout-1"}
    assert {r["user_id"] for r in requests} == {user.pk}
    assert {r["route"] for r in requests} == {"/api/v1/orders/"}
    replay = [r for r in hashed if r.get("event") == "duplicate_suppressed"]
    assert [r["mechanism"] for r in replay] == ["key_replay"]
    assert replay[0]["request_id"] == "req-checkout-1" and replay[0]["user_id"] == user.pk


@pytest.mark.django_db
def test_order_id_of_order_routes(lines, shopper_client):
    shopper_client.get(f"/api/v1/orders/{uuid.uuid4()}/")
    (line,) = [r for r in lines() if r.get("event") == "request"]
    assert line["status"] == 404 and "order_id" in line
    assert line["route"] == "/api/v1/orders/<str:order_id>/"


def test_a_fresh_request_id_when_the_clients_is_unusable(client):
    response = client.get("/healthz", HTTP_X_REQUEST_ID="bad id with spaces" * 20)
    assert response["X-Request-ID"] != "bad id with spaces" * 20
    assert len(response["X-Request-ID"]) == 32


def _record(message: str, *args, **extra) -> logging.LogRecord:
    record = logging.LogRecord("t", logging.INFO, __file__, 1, message, args, None)
    for name, value in extra.items():
        setattr(record, name, value)
    return record


def test_secrets_in_fields_and_messages_are_masked():
    record = _record(
        "auth header Token %s card %s",
        "9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b",
        "4242 4242 4242 4242",
        password="hunter2",
        key="client-key-1",
        authorization="Token abc",
        payment_method="pm_card_ok",
    )
    with log_context(request_id="r1", order_id="o1"):
        line = json.loads(JsonFormatter().format(record))
    text = json.dumps(line)
    for secret in ("9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b", "4242", "hunter2", "client-key-1"):
        assert secret not in text
    assert line["password"] == line["authorization"] == "[redacted]"
    assert line["idempotency_key_hash"] == key_hash("client-key-1")
    assert (line["request_id"], line["order_id"]) == ("r1", "o1")
    assert line["payment_method"] == "pm_card_ok"  # a test method name, not a card


def test_text_format_has_the_same_fields():
    with log_context(request_id="r2"):
        text = TextFormatter().format(_record("hello %s", "world", mechanism="key_replay"))
    assert "INFO t hello world" in text and 'request_id="r2"' in text
    assert 'mechanism="key_replay"' in text


def test_exceptions_are_one_json_line():
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord("t", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    formatted = JsonFormatter().format(record)
    assert "\n" not in formatted
    assert "ValueError: boom" in json.loads(formatted)["exception"]
