"""Fixtures shared by the whole suite. Every test runs on a real PostgreSQL and Redis."""

from __future__ import annotations

import itertools
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from django.core.cache import cache
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

_counter = itertools.count()


@pytest.fixture(autouse=True)
def _clear_cache():
    """Keep throttle counters from leaking between tests."""
    cache.clear()
    yield


@pytest.fixture
def make_user(django_user_model):
    def make(*, staff: bool = False, courier: bool = False, username: str | None = None):
        name = username or f"user{next(_counter)}"
        user = django_user_model.objects.create_user(
            username=name,
            email=f"{name}@example.com",
            password="correct horse battery",
            is_staff=staff,
        )
        if courier:
            user.groups.add(Group.objects.get_or_create(name="couriers")[0])
        return user

    return make


def _client_for(user) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    client.user = user
    return client


@pytest.fixture
def api_client() -> APIClient:
    return APIClient()


@pytest.fixture
def shopper(make_user):
    return make_user()


@pytest.fixture
def shopper_client(shopper) -> APIClient:
    return _client_for(shopper)


@pytest.fixture
def staff_client(make_user) -> APIClient:
    return _client_for(make_user(staff=True))


@pytest.fixture
def client_for():
    return _client_for


@pytest.fixture
def make_product(db):
    from inventory.services import product_create

    def make(sku: str = "TEE-M", *, price: str = "19.99", stock: int = 10, name: str | None = None):
        return product_create(
            sku=sku, name=name or sku, price=Decimal(price), currency="EUR", stock=stock
        )

    return make


def assert_problem(response, status: int, code: str) -> dict:
    """Assert an RFC 9457 problem response with the given status and code; return its body."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    assert response["Content-Type"].startswith("application/problem+json"), response["Content-Type"]
    body = response.json()
    assert body["code"] == code, body
    assert body["status"] == status
    assert body["type"].endswith(code.replace("_", "-"))
    assert body["title"] and body["detail"]
    return body
