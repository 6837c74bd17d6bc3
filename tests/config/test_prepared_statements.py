"""Statements a connection repeats are prepared on the server (docs/performance.md,
"Prepared statements")."""

import psycopg
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection

pytestmark = pytest.mark.django_db(transaction=True)

THRESHOLD = settings.DATABASES["default"]["OPTIONS"].get("prepare_threshold")


def _prepared(cursor) -> int:
    cursor.execute("SELECT count(*) FROM pg_prepared_statements")
    return cursor.fetchone()[0]


def test_the_shop_binds_on_the_server_and_prepares_what_it_repeats():
    assert settings.DATABASES["default"]["OPTIONS"]["server_side_binding"] is True
    assert THRESHOLD
    users = get_user_model().objects
    for n in range(THRESHOLD + 1):
        users.filter(pk=n).exists()
    with connection.cursor() as cursor:
        assert _prepared(cursor) >= 1


def test_wrong_twin_djangos_defaults_prepare_nothing():
    """Django's defaults (values quoted into the text, no threshold): parsed every time."""
    params = {**connection.get_connection_params(), "prepare_threshold": None}
    params.pop("cursor_factory", None)
    with psycopg.connect(**params, cursor_factory=psycopg.ClientCursor) as conn:
        with conn.cursor() as cursor:
            for n in range((THRESHOLD or 5) + 1):
                cursor.execute("SELECT id FROM auth_user WHERE id = %s", [n])
            assert _prepared(cursor) == 0
