"""Password-reset links are aged by the database clock (core/tokens.py).

A link made on a host 5 minutes behind and opened on a host on time, with
links valid for 2 minutes: Django's own generator (the wrong twin) finds it
already 5 minutes old; the database clock's finds it new. The host's clock
is skewed by replacing `datetime.now` where each generator would read it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.contrib.auth import tokens as django_tokens
from django.contrib.auth.tokens import PasswordResetTokenGenerator

from core import tokens

pytestmark = pytest.mark.django_db

SKEW = timedelta(minutes=5)


@pytest.fixture
def host_clock(monkeypatch):
    def set_skew(skew: timedelta) -> None:
        class HostDatetime(datetime):
            @classmethod
            def now(cls, tz=None):
                return datetime.now(tz) + skew

        monkeypatch.setattr(django_tokens, "datetime", HostDatetime)
        monkeypatch.setattr(tokens, "datetime", HostDatetime)

    return set_skew


@pytest.fixture
def shopper(settings, django_user_model):
    settings.PASSWORD_RESET_TIMEOUT = 120
    return django_user_model.objects.create_user("ada", "ada@example.com", "pw-1-long-enough")


def made_behind_opened_on_time(generator: PasswordResetTokenGenerator, host_clock, user) -> bool:
    host_clock(-SKEW)
    token = generator.make_token(user)
    host_clock(timedelta(0))
    return generator.check_token(user, token)


def test_a_link_made_on_a_host_behind_is_new_on_a_host_on_time(host_clock, shopper):
    generator = tokens.DatabaseClockTokenGenerator()
    assert made_behind_opened_on_time(generator, host_clock, shopper)


def test_the_shops_reset_views_use_it():
    from shop.views import accounts

    assert accounts.PasswordResetView.token_generator is tokens.password_reset_token_generator
    assert (
        accounts.PasswordResetConfirmView.token_generator is tokens.password_reset_token_generator
    )


def test_wrong_twin_djangos_generator_ages_a_link_by_the_host_clock(host_clock, shopper):
    assert not made_behind_opened_on_time(PasswordResetTokenGenerator(), host_clock, shopper)
