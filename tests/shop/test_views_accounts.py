"""Password reset (e-mail, link, new password), password change and e-mail change pages."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.core.cache import cache
from django.test import Client

from .test_pages import label_for, names_in

pytestmark = pytest.mark.django_db

User = get_user_model()
OLD = "correct horse battery"  # make_user's password
NEW = "a brand new passphrase 7"


@pytest.fixture(autouse=True)
def _fresh_throttles():
    cache.clear()  # the log-in buckets the reset form shares
    yield
    cache.clear()


def reset_link(message) -> str:
    match = re.search(r"https?://[^/\s]+(/accounts/password-reset/[^/\s]+/[^/\s]+/)", message.body)
    assert match, message.body
    return match[1]


def test_the_reset_form_has_the_contracts_names(client):
    html = client.get("/accounts/password-reset/").content.decode()
    label_for(html, "Email")
    names_in(html, "Reset password")
    assert "/accounts/password-reset/" in client.get("/accounts/login/").content.decode()


def test_a_forgotten_password_is_reset_through_the_emailed_link(client, make_user):
    user = make_user(username="ada")
    response = client.post("/accounts/password-reset/", {"email": "ada@example.com"})
    assert response.status_code == 303
    assert response["Location"] == "/accounts/password-reset/done/"
    assert "Check your e-mail" in client.get(response["Location"]).content.decode()

    (message,) = mail.outbox
    assert message.to == ["ada@example.com"]
    assert "Reset your password" in message.subject
    html_part = message.alternatives[0]
    assert html_part[1] == "text/html" and "Choose a new password" in html_part[0]

    link = reset_link(message)
    form_page = client.get(link, follow=True)  # Django moves the token out of the URL
    assert form_page.status_code == 200
    form_url = form_page.redirect_chain[-1][0]
    html = form_page.content.decode()
    label_for(html, "Password")
    label_for(html, "Confirm password")

    mismatch = client.post(form_url, {"new_password1": NEW, "new_password2": NEW + "x"})
    assert mismatch.status_code == 200
    assert 'id="id_new_password2_error"' in mismatch.content.decode()
    user.refresh_from_db()
    assert user.check_password(OLD)

    done = client.post(form_url, {"new_password1": NEW, "new_password2": NEW})
    assert done.status_code == 303 and done["Location"] == "/accounts/password-reset/complete/"
    assert "Log in" in client.get(done["Location"]).content.decode()
    user.refresh_from_db()
    assert user.check_password(NEW) and not user.check_password(OLD)

    # The link works once.
    again = client.get(link, follow=True).content.decode()
    assert "does not work any more" in again

    fresh = Client()
    logged_in = fresh.post("/accounts/login/", {"username": "ada", "password": NEW})
    assert logged_in.status_code == 303


def test_an_unknown_address_gets_the_same_page_and_no_mail(client, make_user):
    make_user(username="bob")
    response = client.post("/accounts/password-reset/", {"email": "nobody@example.com"})
    assert response.status_code == 303
    assert response["Location"] == "/accounts/password-reset/done/"
    assert mail.outbox == []


def test_a_bad_address_is_the_form_again_with_its_error(client):
    response = client.post("/accounts/password-reset/", {"email": "not an address"})
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="id_email_error"' in html and 'aria-invalid="true"' in html
    assert mail.outbox == []


def test_reset_requests_are_throttled(client, make_user):
    make_user(username="carol")
    codes = [
        client.post("/accounts/password-reset/", {"email": "carol@example.com"}).status_code
        for _ in range(6)
    ]
    assert codes[:5] == [303] * 5 and codes[5] == 429  # the test rate: 5/min
    assert len(mail.outbox) == 5


def test_password_change_keeps_the_session_and_checks_the_current_password(client, make_user):
    user = make_user(username="dora")
    client.force_login(user)
    html = client.get("/accounts/password-change/").content.decode()
    for label in ("Current password", "New password", "Confirm new password"):
        label_for(html, label)
    names_in(html, "Change password")
    assert "/accounts/password-change/" in client.get("/account/").content.decode()

    wrong = client.post(
        "/accounts/password-change/",
        {"old_password": "wrong", "new_password1": NEW, "new_password2": NEW},
    )
    assert wrong.status_code == 200 and 'id="id_old_password_error"' in wrong.content.decode()
    weak = client.post(
        "/accounts/password-change/",
        {"old_password": OLD, "new_password1": "12345678", "new_password2": "12345678"},
    )
    assert weak.status_code == 200 and 'id="id_new_password2_error"' in weak.content.decode()

    changed = client.post(
        "/accounts/password-change/",
        {"old_password": OLD, "new_password1": NEW, "new_password2": NEW},
    )
    assert changed.status_code == 303
    assert changed["Location"] == "/accounts/password-change/done/"
    user.refresh_from_db()
    assert user.check_password(NEW)
    assert client.get("/account/").status_code == 200  # still logged in here


def test_the_email_changes_with_the_current_password(client, make_user):
    user = make_user(username="erin")
    client.force_login(user)
    html = client.get("/account/").content.decode()
    label_for(html, "Email")
    names_in(html, "Change email")

    for data, field in (
        ({"email": "not an address", "current_password": OLD}, "email"),
        ({"email": "erin@example.com", "current_password": OLD}, "email"),  # unchanged
        ({"email": "erin@new.example", "current_password": "wrong"}, "current_password"),
        ({"email": "", "current_password": ""}, "email"),
    ):
        refused = client.post("/account/email/", data)
        assert refused.status_code == 400, data
        assert f'id="id_{field}_error"' in refused.content.decode(), data
        user.refresh_from_db()
        assert user.email == "erin@example.com"

    changed = client.post("/account/email/", {"email": "erin@new.example", "current_password": OLD})
    assert changed.status_code == 303 and changed["Location"] == "/account/"
    user.refresh_from_db()
    assert user.email == "erin@new.example"
    assert "erin@new.example" in client.get("/account/").content.decode()


def test_the_account_forms_refuse_a_post_without_csrf(make_user):
    user = make_user(username="fay")
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    assert browser.post("/account/email/", {"email": "x@example.com"}).status_code == 403
    assert browser.post("/accounts/password-change/", {}).status_code == 403
    assert (
        Client(enforce_csrf_checks=True)
        .post("/accounts/password-reset/", {"email": "fay@example.com"})
        .status_code
        == 403
    )
    user.refresh_from_db()
    assert user.email == "fay@example.com" and mail.outbox == []
