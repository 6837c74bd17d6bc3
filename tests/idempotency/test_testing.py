"""The test helpers that start real server processes name the test database correctly."""

import pytest
from django.db import connection

from tests.support.servers import database_url_for_current_connection


def test_url_names_a_socket_server_by_its_folder(monkeypatch):
    monkeypatch.setattr(
        connection,
        "get_connection_params",
        lambda: {"host": "/tmp/shop-abc/pg", "user": "postgres", "dbname": "x"},
    )
    monkeypatch.setitem(connection.settings_dict, "NAME", "test_shop")
    assert (
        database_url_for_current_connection()
        == "postgres://postgres@/test_shop?host=/tmp/shop-abc/pg"
    )


def test_url_names_a_tcp_server_by_host_and_port(monkeypatch):
    monkeypatch.setattr(
        connection,
        "get_connection_params",
        lambda: {"host": "db.internal", "port": 6543, "user": "u", "password": "p w"},
    )
    monkeypatch.setitem(connection.settings_dict, "NAME", "test_shop")
    assert database_url_for_current_connection() == "postgres://u:p%20w@db.internal:6543/test_shop"


@pytest.mark.parametrize("host", ["/tmp/shop-abc/pg", "127.0.0.1"])
def test_url_round_trips_through_settings_parsing(monkeypatch, host):
    import environ

    monkeypatch.setattr(
        connection,
        "get_connection_params",
        lambda: {"host": host, "port": 5432, "user": "postgres"},
    )
    parsed = environ.Env.db_url_config(database_url_for_current_connection())
    assert parsed["NAME"] == connection.settings_dict["NAME"]
    assert (parsed["HOST"] or parsed.get("OPTIONS", {}).get("host")) == host
