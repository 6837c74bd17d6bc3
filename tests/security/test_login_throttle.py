"""Logging in is throttled per username and per address, by the API and the storefront alike.

The token endpoint's throttles are tested in tests/shop/test_accounts.py
(::test_token_is_throttled_per_username_with_retry_after,
::test_token_is_throttled_per_address). The storefront's log-in form counts
in the same buckets (the test rate is 5/min per username, 25/min per
address): guessing a password through the form is no cheaper than through
the API, and mixing the two gains nothing.
"""

from __future__ import annotations

import pytest
from django.test import Client

from tests.conftest import assert_problem

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery"  # tests.conftest.make_user's


def form_login(browser, username, password, **extra):
    return browser.post("/accounts/login/", {"username": username, "password": password}, **extra)


def logged_in(browser) -> bool:
    return "_auth_user_id" in browser.session


def test_storefront_login_is_throttled_per_username(make_user):
    make_user(username="carol")
    browser = Client()
    for _ in range(5):
        assert form_login(browser, "carol", "wrong").status_code == 200  # the form again
    # Even the right password is refused now, from another address too.
    response = form_login(browser, "carol", PASSWORD)
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    assert b"Too many" in response.content
    assert not logged_in(browser)
    elsewhere = Client(REMOTE_ADDR="198.51.100.9")
    assert form_login(elsewhere, "CAROL", PASSWORD).status_code == 429
    assert not logged_in(elsewhere)
    # Another username from the first address is still allowed.
    make_user(username="dave")
    assert form_login(browser, "dave", PASSWORD).status_code == 303
    assert logged_in(browser)


def test_storefront_login_is_throttled_per_address(make_user):
    make_user(username="erin")
    browser = Client()
    codes = [form_login(browser, f"u{i}", "x").status_code for i in range(25)]
    assert codes == [200] * 25
    assert form_login(browser, "erin", PASSWORD).status_code == 429
    assert not logged_in(browser)


def test_form_and_token_endpoint_share_the_username_budget(make_user, api_client):
    make_user(username="frank")
    for _ in range(3):
        api_client.post(
            "/api/v1/auth/token/", {"username": "frank", "password": "x"}, format="json"
        )
    browser = Client()
    assert form_login(browser, "frank", "x").status_code == 200
    assert form_login(browser, "frank", "x").status_code == 200
    assert form_login(browser, "frank", PASSWORD).status_code == 429
    response = api_client.post(
        "/api/v1/auth/token/", {"username": "frank", "password": PASSWORD}, format="json"
    )
    assert_problem(response, 429, "throttled")


def test_a_get_of_the_login_page_is_not_counted(make_user):
    make_user(username="gina")
    browser = Client()
    for _ in range(10):
        assert browser.get("/accounts/login/").status_code == 200
    assert form_login(browser, "gina", PASSWORD).status_code == 303


def test_a_forged_x_forwarded_for_does_not_buy_a_fresh_address_budget(api_client):
    """Without a proxy the client's own X-Forwarded-For must not name its address."""
    codes = [
        api_client.post(
            "/api/v1/auth/token/",
            {"username": f"v{i}", "password": "x"},
            format="json",
            HTTP_X_FORWARDED_FOR=f"192.0.2.{i}",
        ).status_code
        for i in range(26)
    ]
    assert codes[:25] == [400] * 25
    assert codes[25] == 429
    browser = Client(HTTP_X_FORWARDED_FOR="192.0.2.200")
    assert form_login(browser, "someone", "x").status_code == 429  # same address, same budget


def admin_login(browser, username, password):
    return browser.post(
        "/admin/login/?next=/admin/",
        {"username": username, "password": password, "next": "/admin/"},
    )


def test_admin_login_is_throttled_in_the_same_budget(make_user):
    make_user(username="sam", staff=True)
    browser = Client()
    for _ in range(3):
        assert admin_login(browser, "sam", "wrong").status_code == 200  # the form again
    assert form_login(browser, "sam", "wrong").status_code == 200  # the storefront's form
    assert admin_login(browser, "sam", "wrong").status_code == 200  # the 5th attempt
    # Even the right password is refused now, before it is checked.
    response = admin_login(browser, "sam", PASSWORD)
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    assert b"Too many log-in attempts" in response.content
    assert b'name="password"' in response.content  # the admin's form, to try again later
    assert not logged_in(browser)
    # Another staff member from elsewhere logs in as usual.
    make_user(username="tess", staff=True)
    response = admin_login(Client(REMOTE_ADDR="198.51.100.7"), "tess", PASSWORD)
    assert response.status_code == 302 and response["Location"] == "/admin/"


# -- hosts whose clocks differ (shop/api/throttles.py::DatabaseClockThrottle) ---------------


class _Attempt:
    def __init__(self, username: str):
        self.data = {"username": username}
        self.META = {"REMOTE_ADDR": "203.0.113.7"}


def _allowed_alternating_hosts(monkeypatch, throttle_class, username: str) -> int:
    """Attempts allowed of 12 for one username, a balancer alternating between a host on
    time and one 5 minutes ahead (each host a process that reads its own clock offset)."""
    import time

    from core import db

    real_time = time.time
    allowed = 0
    for attempt in range(12):
        skew = 300.0 if attempt % 2 else 0.0
        monkeypatch.setattr(time, "time", lambda skew=skew: real_time() + skew)
        monkeypatch.setattr(db, "_clock_offset", None)  # another host's process
        allowed += throttle_class().allow_request(_Attempt(username), None)
    return allowed


def test_the_username_budget_holds_across_hosts_whose_clocks_differ(monkeypatch):
    from shop.api.throttles import TokenUsernameThrottle

    assert _allowed_alternating_hosts(monkeypatch, TokenUsernameThrottle, "frank") == 5


def test_wrong_twin_drfs_host_clock_throttle_lets_more_through(monkeypatch):
    import time

    from shop.api.throttles import TokenUsernameThrottle

    class HostClockThrottle(TokenUsernameThrottle):
        def timer(self) -> float:
            return time.time()  # DRF's own `timer`: this host's clock

    assert _allowed_alternating_hosts(monkeypatch, HostClockThrottle, "grace") > 5
