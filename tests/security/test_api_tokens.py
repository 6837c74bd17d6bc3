"""API tokens like a real API (docs/security.md, "API tokens"; contract "Authentication and roles").

Driven through the doors a client and a browser use (the token endpoint, the
storefront's password pages, the admin's password form, the account page),
so that each guarantee reads the same whatever stores the token:

- the database holds no usable token: no column of any table holds the token
  a client was given, and nothing the token table holds authenticates;
- each log-in is its own token (one per device), each working;
- a password changed (storefront, reset link, admin, any `set_password`) or
  an account deleted revokes every token of the user: 401 `not_authenticated`;
- "Log out everywhere" ends every token and every session of the user, and
  only theirs.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.core.cache import cache
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

from core.sessions import SessionStore
from tests.conftest import assert_problem

pytestmark = pytest.mark.django_db

User = get_user_model()
OLD = "correct horse battery"  # make_user's password
NEW = "a brand new passphrase 7"


@pytest.fixture(autouse=True)
def _fresh_throttles():
    cache.clear()  # the log-in buckets the token endpoint and the forms share
    yield
    cache.clear()


def log_in(username: str, password: str = OLD) -> str:
    """`POST /api/v1/auth/token/` as a client does; the token it answers."""
    answer = APIClient().post(
        "/api/v1/auth/token/", {"username": username, "password": password}, format="json"
    )
    assert answer.status_code == 200, answer.content
    return answer.json()["token"]


def api(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def works(token: str) -> bool:
    answer = api(token).get("/api/v1/orders/")
    assert answer.status_code in (200, 401), answer.content
    return answer.status_code == 200


def assert_revoked(token: str) -> None:
    assert_problem(api(token).get("/api/v1/orders/"), 401, "not_authenticated")


def browser_of(username: str, password: str = OLD) -> Client:
    browser = Client(enforce_csrf_checks=False)
    assert browser.post("/accounts/login/", {"username": username, "password": password})[
        "Location"
    ]
    assert browser.get("/account/").status_code == 200
    return browser


def _text_columns() -> list[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema()"
            " AND data_type IN ('character varying', 'text', 'character', 'jsonb', 'json')"
        )
        return cursor.fetchall()


def _stored_values(table_filter: str) -> list[str]:
    """Every text value in the tables whose name contains `table_filter`."""
    values = []
    with connection.cursor() as cursor:
        for table, column in _text_columns():
            if table_filter in table:
                cursor.execute(f'SELECT "{column}"::text FROM "{table}"')  # noqa: S608
                values += [row[0] for row in cursor.fetchall() if row[0]]
    return values


# --- Stored so that a copy of the database yields no usable token ---------------


def test_no_table_holds_a_token_a_client_was_given(api_client, make_user):
    registered = api_client.post(
        "/api/v1/auth/register/",
        {"username": "alice", "email": "alice@example.com", "password": OLD},
        format="json",
    ).json()["token"]
    make_user(username="bob")
    given = [registered, log_in("alice"), log_in("bob")]
    assert all(works(token) for token in given)

    with connection.cursor() as cursor:
        for table, column in _text_columns():
            for token in given:
                cursor.execute(
                    f'SELECT count(*) FROM "{table}" WHERE strpos("{column}"::text, %s) > 0',  # noqa: S608
                    [token],
                )
                assert cursor.fetchone()[0] == 0, f"{table}.{column} holds a token as given"

    stored = _stored_values("token")
    assert stored, "the token table holds the tokens' rows"
    for value in stored:
        assert not works(value), "a value read from the token table authenticates"


# --- One token per log-in --------------------------------------------------------


def test_each_log_in_is_a_new_token_and_every_one_works(make_user):
    make_user(username="carol")
    phone, laptop, script = log_in("carol"), log_in("carol"), log_in("carol")
    assert len({phone, laptop, script}) == 3
    assert works(phone) and works(laptop) and works(script)


# --- Revoked when the password changes or is reset, or the account is deleted ------


def _change_in_the_storefront(user) -> None:
    browser = browser_of(user.username)
    changed = browser.post(
        "/accounts/password-change/",
        {"old_password": OLD, "new_password1": NEW, "new_password2": NEW},
    )
    assert changed.status_code == 303, changed.content


def _reset_by_the_emailed_link(user) -> None:
    browser = Client()
    mail.outbox.clear()
    assert browser.post("/accounts/password-reset/", {"email": user.email}).status_code == 303
    (message,) = mail.outbox
    link = re.search(r"https?://[^/\s]+(/accounts/password-reset/[^/\s]+/[^/\s]+/)", message.body)
    form_url = browser.get(link[1])["Location"]  # Django swaps the token for a session marker
    done = browser.post(form_url, {"new_password1": NEW, "new_password2": NEW})
    assert done.status_code == 303 and done["Location"] == "/accounts/password-reset/complete/"


def _change_in_the_admin(user) -> None:
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", "root@example.com", "root pass 123"))
    changed = admin.post(
        f"/admin/auth/user/{user.pk}/password/",
        {"password1": NEW, "password2": NEW, "usable_password": "true"},
    )
    assert changed.status_code == 302, changed.content


def _set_password_anywhere(user) -> None:
    """Any code path (a shell, `changepassword`): Django's `set_password` and `save`."""
    user = User.objects.get(pk=user.pk)
    user.set_password(NEW)
    user.save()


@pytest.mark.parametrize(
    "change",
    [
        _change_in_the_storefront,
        _reset_by_the_emailed_link,
        _change_in_the_admin,
        _set_password_anywhere,
    ],
    ids=["storefront", "reset-link", "admin", "set_password"],
)
def test_a_password_change_revokes_every_token_of_the_user(make_user, change):
    user = make_user(username="dora")
    other = make_user(username="eve")
    phone, laptop, theirs = log_in("dora"), log_in("dora"), log_in("eve")
    assert works(phone) and works(laptop)

    change(user)

    User.objects.get(pk=user.pk).check_password(NEW)
    assert_revoked(phone)
    assert_revoked(laptop)
    assert works(theirs), "another user's token is not theirs to revoke"
    assert works(log_in("dora", NEW)), "logging in with the new password gives a working token"
    assert other.is_active


def test_wrong_twin_without_the_auth_hash_check_a_changed_password_keeps_the_token(
    make_user, monkeypatch
):
    """No signal or service revokes: the authentication's auth-hash check is what does."""
    from core import authentication

    monkeypatch.setattr(authentication, "_password_unchanged", lambda token: True)
    user = make_user(username="kim")
    token = log_in("kim")
    _set_password_anywhere(user)
    assert works(token)


def test_deleting_the_account_in_the_storefront_revokes_every_token(make_user):
    make_user(username="finn")
    phone, laptop = log_in("finn"), log_in("finn")
    browser = browser_of("finn")
    assert browser.post("/account/delete/", {"confirm": "yes"}).status_code == 303
    assert_revoked(phone)
    assert_revoked(laptop)


def test_deleting_the_account_through_the_api_revokes_every_token(make_user):
    make_user(username="gus")
    phone, laptop = log_in("gus"), log_in("gus")
    assert api(phone).delete("/api/v1/auth/account/").status_code == 204
    assert_revoked(phone)
    assert_revoked(laptop)


# --- "Log out everywhere" ---------------------------------------------------------


def test_log_out_everywhere_ends_every_token_and_session_of_the_user_only(make_user):
    make_user(username="hana")
    make_user(username="ivan")
    phone, laptop = log_in("hana"), log_in("hana")
    here, elsewhere = browser_of("hana"), browser_of("hana")
    theirs, their_browser = log_in("ivan"), browser_of("ivan")
    guest = SessionStore()  # a guest's session (a cart) has no user
    guest["kept"] = True
    guest.create()

    page = here.get("/account/").content.decode()
    assert "Log out everywhere" in page
    answer = here.post("/account/logout-everywhere/")
    assert answer.status_code == 303

    assert_revoked(phone)
    assert_revoked(laptop)
    assert here.get("/account/").status_code == 302, "this browser is logged out"
    assert elsewhere.get("/account/").status_code == 302, "the other browser is logged out"
    assert works(theirs)
    assert their_browser.get("/account/").status_code == 200
    assert SessionStore(guest.session_key).load() == {"kept": True}, "a guest's session stays"
    assert works(log_in("hana")), "logging in again gives a working token"


def test_log_out_everywhere_needs_csrf_and_a_post(make_user):
    make_user(username="jay")
    token = log_in("jay")
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(User.objects.get(username="jay"))
    assert browser.post("/account/logout-everywhere/").status_code == 403
    assert browser.get("/account/logout-everywhere/").status_code == 405
    assert works(token)
    assert browser.get("/account/").status_code == 200
