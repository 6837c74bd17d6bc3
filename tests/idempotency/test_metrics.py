"""Counters live in Redis, shared by every process; an outage never fails the caller."""

import pytest
from django.test import override_settings

from idempotency import metrics


def test_count_and_read_by_labels():
    before = metrics.read("shop_test_total")
    metrics.count("shop_test_total", code="a")
    metrics.count("shop_test_total", code="a")
    metrics.count("shop_test_total", amount=3, code="b", mechanism="x")
    after = metrics.read("shop_test_total")
    assert after['code="a"'] == before.get('code="a"', 0) + 2
    assert after['code="b",mechanism="x"'] == before.get('code="b",mechanism="x"', 0) + 3


def test_redis_outage_is_swallowed(monkeypatch, unused_port):
    monkeypatch.setattr(metrics, "_local", type(metrics._local)())
    with override_settings(REDIS_URL=f"redis://127.0.0.1:{unused_port}/0"):
        metrics.count("shop_test_total", code="lost")
    monkeypatch.setattr(metrics, "_local", type(metrics._local)())


@pytest.fixture
def unused_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
