"""API tokens: expiry by the database clock, one query, the purge (core/authentication.py).

A token older than API_TOKEN_LIFETIME by the database clock answers 401; the
same query finds the token, its user, its age and the courier role;
`api_tokens_purge` deletes the rows past the lifetime and only those.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from core.api_tokens import IssuedToken, api_token_issue, api_tokens_purge
from core.models import ApiToken

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery"  # tests/conftest.py's make_user


def _age_token(token: IssuedToken, *, seconds: int) -> None:
    """Move the token's issue time back by the database clock (no process clock involved)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE core_apitoken SET created = now() - make_interval(secs => %s)"
            " WHERE digest = %s",
            [seconds, token.row.digest],
        )


def _client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_a_token_within_its_lifetime_authenticates(shopper, settings):
    settings.API_TOKEN_LIFETIME = 3600
    token = api_token_issue(user=shopper)
    _age_token(token, seconds=3500)
    assert _client(token.key).get("/api/v1/orders/").status_code == 200


def test_an_expired_token_is_401_with_a_problem_body(shopper, settings):
    settings.API_TOKEN_LIFETIME = 3600
    token = api_token_issue(user=shopper)
    _age_token(token, seconds=3601)
    answer = _client(token.key).get("/api/v1/orders/")
    assert answer.status_code == 401
    assert answer["Content-Type"].startswith("application/problem+json")
    body = answer.json()
    assert body["code"] == "not_authenticated"
    assert "expired" in body["detail"]


def test_asking_again_gives_a_new_token_beside_the_live_one(shopper, settings):
    settings.API_TOKEN_LIFETIME = 3600
    old = api_token_issue(user=shopper)
    aged = api_token_issue(user=shopper)
    _age_token(aged, seconds=7200)
    answer = APIClient().post(
        "/api/v1/auth/token/", {"username": shopper.username, "password": PASSWORD}, format="json"
    )
    assert answer.status_code == 200, answer.content
    new = answer.json()["token"]
    assert new not in (old.key, aged.key)
    assert _client(new).get("/api/v1/orders/").status_code == 200
    assert _client(old.key).get("/api/v1/orders/").status_code == 200  # another device's
    assert _client(aged.key).get("/api/v1/orders/").status_code == 401


def test_a_changed_password_revokes_with_a_problem_body_saying_so(shopper):
    token = api_token_issue(user=shopper)
    shopper.set_password("another passphrase 9")
    shopper.save()
    body = _client(token.key).get("/api/v1/orders/").json()
    assert body["code"] == "not_authenticated" and "password changed" in body["detail"]


def test_the_token_query_says_whether_the_user_is_a_courier(make_user):
    courier = make_user(courier=True)
    shopper = make_user()
    couriers = _client(api_token_issue(user=courier).key)
    shoppers = _client(api_token_issue(user=shopper).key)

    # A courier is refused the order list, a shopper is not: each with the token's one query.
    with CaptureQueriesContext(connection) as queries:
        assert couriers.get("/api/v1/orders/").status_code == 403
    assert len(queries) == 1 and "auth_user_groups" in queries[0]["sql"]
    assert shoppers.get("/api/v1/orders/").status_code == 200


def test_the_purge_deletes_the_tokens_past_their_lifetime_only(make_user, settings):
    settings.API_TOKEN_LIFETIME = 3600
    shopper, other = make_user(), make_user()
    live = api_token_issue(user=shopper)
    nearly = api_token_issue(user=other)
    _age_token(nearly, seconds=3500)
    gone = [api_token_issue(user=user) for user in (shopper, other, shopper)]
    for token in gone:
        _age_token(token, seconds=3601)

    assert api_tokens_purge(batch=2) == 3  # two batches, the second one short
    assert set(ApiToken.objects.values_list("digest", flat=True)) == {
        live.row.digest,
        nearly.row.digest,
    }
    assert api_tokens_purge() == 0
    assert _client(live.key).get("/api/v1/orders/").status_code == 200
