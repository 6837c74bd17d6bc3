"""API tokens expire after API_TOKEN_LIFETIME by the database clock (core/authentication.py)."""

from __future__ import annotations

import pytest
from django.db import connection
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery"  # tests/conftest.py's make_user


def _age_token(token: Token, *, seconds: int) -> None:
    """Move the token's issue time back by the database clock (no process clock involved)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE authtoken_token SET created = now() - make_interval(secs => %s) WHERE key = %s",
            [seconds, token.key],
        )


def _client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_a_token_within_its_lifetime_authenticates(shopper, settings):
    settings.API_TOKEN_LIFETIME = 3600
    token = Token.objects.create(user=shopper)
    _age_token(token, seconds=3500)
    assert _client(token.key).get("/api/v1/orders/").status_code == 200


def test_an_expired_token_is_401_with_a_problem_body(shopper, settings):
    settings.API_TOKEN_LIFETIME = 3600
    token = Token.objects.create(user=shopper)
    _age_token(token, seconds=3601)
    answer = _client(token.key).get("/api/v1/orders/")
    assert answer.status_code == 401
    assert answer["Content-Type"].startswith("application/problem+json")
    body = answer.json()
    assert body["code"] == "not_authenticated"
    assert "expired" in body["detail"]


def test_asking_again_replaces_an_expired_token_and_the_new_one_works(shopper, settings):
    settings.API_TOKEN_LIFETIME = 3600
    old = Token.objects.create(user=shopper)
    _age_token(old, seconds=7200)
    answer = APIClient().post(
        "/api/v1/auth/token/", {"username": shopper.username, "password": PASSWORD}, format="json"
    )
    assert answer.status_code == 200, answer.content
    new = answer.json()["token"]
    assert new != old.key
    assert _client(new).get("/api/v1/orders/").status_code == 200
    assert _client(old.key).get("/api/v1/orders/").status_code == 401


def test_asking_again_within_the_lifetime_keeps_the_token(shopper, settings):
    settings.API_TOKEN_LIFETIME = 3600
    token = Token.objects.create(user=shopper)
    answer = APIClient().post(
        "/api/v1/auth/token/", {"username": shopper.username, "password": PASSWORD}, format="json"
    )
    assert answer.json()["token"] == token.key


def test_the_token_query_says_whether_the_user_is_a_courier(make_user):
    from django.test.utils import CaptureQueriesContext

    courier = make_user(courier=True)
    shopper = make_user()
    couriers = _client(Token.objects.create(user=courier).key)
    shoppers = _client(Token.objects.create(user=shopper).key)

    # A courier is refused the order list, a shopper is not: each with the token's one query.
    with CaptureQueriesContext(connection) as queries:
        assert couriers.get("/api/v1/orders/").status_code == 403
    assert len(queries) == 1 and "auth_user_groups" in queries[0]["sql"]
    assert shoppers.get("/api/v1/orders/").status_code == 200
