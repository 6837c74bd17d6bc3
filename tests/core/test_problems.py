"""Every class of API error is an RFC 9457 problem, never HTML, never a 500 for bad input."""

import json
import threading

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings

from inventory.models import StockItem
from tests.conftest import assert_problem

pytestmark = pytest.mark.django_db


def test_unknown_api_url_is_problem_404(api_client):
    assert_problem(api_client.get("/api/v1/nothing-here/"), 404, "not_found")


def test_unauthenticated_is_401_with_challenge(api_client):
    response = api_client.delete("/api/v1/auth/account/")
    assert_problem(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"].startswith("Token")


def test_api_path_without_trailing_slash_is_served_not_redirected(api_client, make_product):
    make_product("MUG")
    response = api_client.get("/api/v1/products")
    assert response.status_code == 200
    assert response.json()["results"][0]["sku"] == "MUG"
    assert api_client.get("/api/v1/products/MUG").json()["sku"] == "MUG"


def test_post_without_trailing_slash_keeps_its_body(staff_client):
    body = {"sku": "CAP", "name": "Cap", "price": "5.00", "currency": "EUR", "stock": 1}
    response = staff_client.post("/api/v1/products", body, format="json")
    assert response.status_code == 201, response.content


def test_keyed_path_without_slash_is_the_same_request(staff_client, make_product):
    make_product("MUG", stock=1)
    first = staff_client.post(
        "/api/v1/products/MUG/stock", {"delta": 1}, format="json", HTTP_IDEMPOTENCY_KEY="k-slash"
    )
    assert first.status_code == 200, first.content
    again = staff_client.post(
        "/api/v1/products/MUG/stock/", {"delta": 1}, format="json", HTTP_IDEMPOTENCY_KEY="k-slash"
    )
    assert again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["on_hand"] == 2


def test_healthz_with_slash_is_problem_404(api_client):
    assert_problem(api_client.get("/healthz/"), 404, "not_found")


def test_bad_token_is_401(api_client):
    api_client.credentials(HTTP_AUTHORIZATION="Token nope")
    assert_problem(api_client.delete("/api/v1/auth/account/"), 401, "not_authenticated")


def test_forbidden_is_403(shopper_client):
    assert_problem(
        shopper_client.post("/api/v1/products/", {}, format="json"), 403, "permission_denied"
    )


def test_wrong_method_is_405(api_client):
    assert_problem(api_client.delete("/api/v1/products/"), 405, "method_not_allowed")


def test_malformed_json_is_400(staff_client):
    response = staff_client.post(
        "/api/v1/products/", data="{not json", content_type="application/json"
    )
    assert_problem(response, 400, "malformed_json")


def test_wrong_media_type_is_415(staff_client):
    response = staff_client.post("/api/v1/products/", data="sku=x", content_type="text/plain")
    assert_problem(response, 415, "unsupported_media_type")


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=100)
def test_oversized_body_is_413(staff_client):
    response = staff_client.post(
        "/api/v1/products/", data='{"name": "' + "x" * 500 + '"}', content_type="application/json"
    )
    assert_problem(response, 413, "payload_too_large")


def test_validation_error_lists_fields(staff_client):
    body = assert_problem(
        staff_client.post("/api/v1/products/", {"sku": "bad sku!"}, format="json"),
        400,
        "invalid_request",
    )
    assert {"sku", "name", "price", "currency"} <= set(body["errors"])


@pytest.mark.parametrize("body", [{"delta": 1, "set": 1}, [1, 2]])
def test_whole_body_errors_are_non_field_errors(staff_client, make_product, body):
    make_product("MUG")
    response = staff_client.post(
        "/api/v1/products/MUG/stock/", body, format="json", HTTP_IDEMPOTENCY_KEY="k-nfe"
    )
    errors = assert_problem(response, 400, "invalid_request")["errors"]
    assert isinstance(errors["non_field_errors"], list)


def test_nested_member_errors_are_a_list_of_messages():
    from rest_framework.exceptions import ValidationError

    from core.problems import exception_to_problem

    detail = {
        "lines": {"non_field_errors": ["This list may not be empty."]},
        "shipping_address": {"city": ["This field is required."]},
        "items": {0: {"non_field_errors": ["Expected a dictionary."]}},
    }
    body, status, _ = exception_to_problem(ValidationError(detail))
    assert status == 400
    assert json.loads(json.dumps(body["errors"])) == {
        "lines": ["This list may not be empty."],
        "shipping_address": {"city": ["This field is required."]},
        "items": {"0": ["Expected a dictionary."]},
    }
    assert body["detail"] == "lines: This list may not be empty."


def test_json_array_body_is_400_not_500(staff_client):
    assert_problem(
        staff_client.post("/api/v1/products/", data="[1, 2]", content_type="application/json"),
        400,
        "invalid_request",
    )


def test_unexpected_exception_is_problem_500(api_client, monkeypatch):
    from inventory import selectors

    def boom():
        raise RuntimeError("bug")

    monkeypatch.setattr(selectors, "product_list", boom)
    api_client.raise_request_exception = False
    assert_problem(api_client.get("/api/v1/products/"), 500, "internal_error")


@pytest.mark.django_db(transaction=True)
def test_a_lock_timeout_is_503_with_retry_after_and_the_same_request_then_succeeds(
    staff_client, make_product
):
    """A bounded wait that runs out (lock_timeout) is the database being busy, not a 500:
    503 `service_unavailable` with Retry-After; sent again with the same key, it finishes."""
    make_product("MUG", stock=1)
    stock_id = StockItem.objects.get(product__sku="MUG").pk
    held, release = threading.Event(), threading.Event()

    def hold_the_row():
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "SELECT 1 FROM inventory_stockitem WHERE id = %s FOR UPDATE", [stock_id]
                )
                held.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    try:
        assert held.wait(10)
        with connection.cursor() as cursor:  # this thread's connection serves the request
            cursor.execute("SET lock_timeout = '300ms'")
        response = staff_client.post(
            "/api/v1/products/MUG/stock/",
            {"delta": 2},
            format="json",
            HTTP_IDEMPOTENCY_KEY="k-busy",
        )
        assert_problem(response, 503, "service_unavailable")
        assert response["Retry-After"] == "1"
    finally:
        release.set()
        holder.join(30)
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = 0")
    again = staff_client.post(
        "/api/v1/products/MUG/stock/", {"delta": 2}, format="json", HTTP_IDEMPOTENCY_KEY="k-busy"
    )
    assert again.status_code in (200, 201), again.content
    assert StockItem.objects.get(pk=stock_id).on_hand == 3
