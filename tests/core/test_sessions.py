"""Sessions end by the database clock, whatever the host's clock says (core/sessions.py).

Each case writes a session on one host and reads it on another, the hosts'
clocks `timezone.now()` set apart as the chaos run's skewed host is (5
minutes). Django's own `db` store is the wrong twin: it writes and checks
the end by the host's clock.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.sessions.backends import db as django_db
from django.db.models.functions import Now
from django.utils import timezone

from core import sessions

pytestmark = pytest.mark.django_db

SKEW = timedelta(minutes=5)
AGE = 120  # seconds: shorter than the skew


@pytest.fixture(autouse=True)
def short_sessions(settings):
    settings.SESSION_COOKIE_AGE = AGE


@pytest.fixture
def host_clock(monkeypatch):
    """Set this host's clock `skew` off the real one (what Django's sessions read)."""
    real_now = timezone.now

    def set_skew(skew: timedelta) -> None:
        monkeypatch.setattr(timezone, "now", lambda: real_now() + skew)

    return set_skew


def written(store_class, host_clock, *, skew: timedelta) -> str:
    host_clock(skew)
    store = store_class()
    store["user"] = "shopper-1"
    store.create()
    return store.session_key


def read(store_class, host_clock, key: str, *, skew: timedelta):
    host_clock(skew)
    return store_class(key).get("user")


def test_the_engine_is_the_database_clocks(settings):
    assert settings.SESSION_ENGINE == "core.sessions"


def test_a_session_lives_its_age_on_every_host(host_clock):
    store_class = sessions.SessionStore
    # Written on a host behind, read on one on time; written on time, read on one ahead.
    key = written(store_class, host_clock, skew=-SKEW)
    assert read(store_class, host_clock, key, skew=timedelta(0)) == "shopper-1"
    key = written(store_class, host_clock, skew=timedelta(0))
    assert read(store_class, host_clock, key, skew=SKEW) == "shopper-1"
    assert read(store_class, host_clock, key, skew=-SKEW) == "shopper-1"


def test_a_session_past_its_end_is_refused_on_a_host_behind(host_clock):
    key = written(sessions.SessionStore, host_clock, skew=timedelta(0))
    sessions.SessionStore.get_model_class().objects.filter(session_key=key).update(
        expire_date=Now() - timedelta(seconds=1)
    )
    assert read(sessions.SessionStore, host_clock, key, skew=-SKEW) is None


def test_clearing_expired_sessions_on_a_host_ahead_keeps_the_live_ones(host_clock):
    model = sessions.SessionStore.get_model_class()
    live = written(sessions.SessionStore, host_clock, skew=timedelta(0))
    ended = written(sessions.SessionStore, host_clock, skew=timedelta(0))
    model.objects.filter(session_key=ended).update(expire_date=Now() - timedelta(seconds=1))
    host_clock(SKEW)
    sessions.SessionStore.clear_expired()
    assert list(model.objects.values_list("session_key", flat=True)) == [live]


def test_wrong_twin_djangos_store_ends_sessions_by_the_host_clock(host_clock):
    store = django_db.SessionStore
    # Written on a host behind: already 3 minutes past its end for a host on time.
    key = written(store, host_clock, skew=-SKEW)
    assert read(store, host_clock, key, skew=timedelta(0)) is None
    # Written on time, read on a host ahead: refused 5 minutes early.
    key = written(store, host_clock, skew=timedelta(0))
    assert read(store, host_clock, key, skew=SKEW) is None
    # Past its end, read on a host behind: still accepted.
    host_clock(timedelta(0))
    store.get_model_class().objects.filter(session_key=key).update(
        expire_date=timezone.now() - timedelta(seconds=1)  # the twin's own (host) clock
    )
    assert read(store, host_clock, key, skew=-SKEW) == "shopper-1"


def test_a_sessions_row_names_its_user_and_a_guests_none(client, make_user):
    """The `user_id` column "Log out everywhere" reads (core.models.Session): written on
    every save from the session's logged-in user; a guest's and a logged-out one's: none."""
    model = sessions.SessionStore.get_model_class()
    user = make_user()
    client.get("/cart/")
    client.session.save()
    guest_key = client.session.session_key
    assert model.objects.get(session_key=guest_key).user_id is None

    client.post(
        "/accounts/login/", {"username": user.username, "password": "correct horse battery"}
    )
    logged_in = client.session.session_key
    assert model.objects.get(session_key=logged_in).user_id == user.pk

    client.post("/accounts/logout/")
    assert not model.objects.filter(user_id=user.pk).exists()
    assert sessions.sessions_end(user_id=user.pk) == 0
