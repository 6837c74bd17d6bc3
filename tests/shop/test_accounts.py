import pytest
from django.contrib.auth import get_user_model

from core.api_tokens import token_digest
from core.models import ApiToken
from tests.conftest import assert_problem

pytestmark = pytest.mark.django_db

User = get_user_model()
GOOD = {"username": "alice", "email": "alice@example.com", "password": "correct horse battery"}


def test_register_returns_token_that_authenticates(api_client):
    response = api_client.post("/api/v1/auth/register/", GOOD, format="json")
    assert response.status_code == 201
    token = response.json()["token"]
    user = User.objects.get(username="alice")
    assert not user.is_staff
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert api_client.delete("/api/v1/auth/account/").status_code == 204


def test_register_twice_is_409(api_client):
    api_client.post("/api/v1/auth/register/", GOOD, format="json")
    assert_problem(
        api_client.post("/api/v1/auth/register/", GOOD, format="json"), 409, "username_taken"
    )


def test_register_weak_password_is_400(api_client):
    body = assert_problem(
        api_client.post("/api/v1/auth/register/", {**GOOD, "password": "123"}, format="json"),
        400,
        "invalid_request",
    )
    assert "password" in body["errors"]
    assert not User.objects.filter(username="alice").exists()


def test_register_missing_fields_lists_them(api_client):
    body = assert_problem(
        api_client.post("/api/v1/auth/register/", {}, format="json"), 400, "invalid_request"
    )
    assert set(body["errors"]) == {"username", "email", "password"}


@pytest.mark.parametrize(
    "field, value",
    [
        ("username", 12345678),
        ("email", ["a@example.com"]),
        ("password", 12345678),
        ("is_staff", True),
    ],
)
def test_register_fields_have_strict_json_types(api_client, field, value):
    body = {"username": "newbie", "email": "n@example.com", "password": "Corr3ct-horse!"}
    response = api_client.post("/api/v1/auth/register/", {**body, field: value}, format="json")
    assert field in assert_problem(response, 400, "invalid_request")["errors"]


@pytest.mark.parametrize("field, value", [("username", 5), ("password", 5), ("otp", "1")])
def test_token_fields_have_strict_json_types(api_client, field, value):
    body = {"username": "someone", "password": "secret"}
    response = api_client.post("/api/v1/auth/token/", {**body, field: value}, format="json")
    assert field in assert_problem(response, 400, "invalid_request")["errors"]


def test_token_for_good_credentials(api_client):
    api_client.post("/api/v1/auth/register/", GOOD, format="json")
    response = api_client.post(
        "/api/v1/auth/token/", {"username": "alice", "password": GOOD["password"]}, format="json"
    )
    assert response.status_code == 200
    token = response.json()["token"]
    assert ApiToken.objects.get(digest=token_digest(token)).user.username == "alice"


def test_bad_credentials_are_invalid_credentials(api_client, make_user):
    make_user(username="bob")
    assert_problem(
        api_client.post(
            "/api/v1/auth/token/", {"username": "bob", "password": "wrong"}, format="json"
        ),
        400,
        "invalid_credentials",
    )


def test_token_is_throttled_per_username_with_retry_after(api_client, make_user):
    make_user(username="carol")
    attempt = {"username": "carol", "password": "wrong"}
    codes = [
        api_client.post("/api/v1/auth/token/", attempt, format="json").status_code for _ in range(5)
    ]
    assert codes == [400] * 5  # test rate: 5/min
    response = api_client.post("/api/v1/auth/token/", attempt, format="json")
    assert_problem(response, 429, "throttled")
    assert int(response["Retry-After"]) >= 1
    # Another username from the same address is still allowed.
    other = api_client.post(
        "/api/v1/auth/token/", {"username": "dave", "password": "x"}, format="json"
    )
    assert other.status_code == 400


def test_token_is_throttled_per_address(api_client):
    codes = [
        api_client.post(
            "/api/v1/auth/token/", {"username": f"u{i}", "password": "x"}, format="json"
        ).status_code
        for i in range(26)
    ]
    assert codes[:25] == [400] * 25
    assert codes[25] == 429


def test_inactive_user_gets_no_token(api_client, make_user):
    user = make_user(username="erin")
    user.is_active = False
    user.save()
    assert_problem(
        api_client.post(
            "/api/v1/auth/token/",
            {"username": "erin", "password": "correct horse battery"},
            format="json",
        ),
        400,
        "invalid_credentials",
    )


def test_account_deletion_anonymises_and_revokes(shopper_client, shopper):
    assert ApiToken.objects.filter(user=shopper).exists()
    assert shopper_client.delete("/api/v1/auth/account/").status_code == 204
    shopper.refresh_from_db()
    assert shopper.username.startswith("deleted-")
    assert shopper.email == ""
    assert not shopper.is_active
    assert not shopper.has_usable_password()
    assert not ApiToken.objects.filter(user=shopper).exists()
    assert_problem(shopper_client.get("/api/v1/auth/account/"), 401, "not_authenticated")


def test_session_authentication_works_for_api(client, make_user):
    user = make_user(actions=True)
    client.force_login(user)
    response = client.post(
        "/api/v1/products/",
        {"sku": "S-1", "name": "s", "price": "1.00", "currency": "EUR", "stock": 1},
        content_type="application/json",
    )
    assert response.status_code == 201


def test_the_migration_makes_the_couriers_group():
    # Its function, not the table as migrated: a transactional test run earlier in
    # the same worker ends with a flush that empties every table.
    import importlib

    from django.apps import apps
    from django.contrib.auth.models import Group

    migration = importlib.import_module("shop.migrations.0001_couriers_group")
    Group.objects.filter(name="couriers").delete()
    migration.create_couriers(apps, None)
    assert Group.objects.filter(name="couriers").exists()
