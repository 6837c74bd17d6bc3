"""The chaos run's clients (tools/chaos/workload.py)."""

from __future__ import annotations

from tools.chaos.workload import _server_took


def test_the_servers_own_time_is_read_from_its_server_timing_header():
    assert _server_took("app;dur=20104.3") == 20.104
    assert _server_took("db;dur=3, app;dur=1500") == 1.5
    assert _server_took("") is None  # gunicorn's own error answers have none
    assert _server_took("app;dur=soon") is None
