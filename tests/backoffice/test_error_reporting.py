"""Error reporting: off without SENTRY_DSN; with it, an unhandled error is sent without PII."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sentry_sdk
from sentry_sdk.transport import Transport

from backoffice.error_reporting import error_reporting_init

ROOT = Path(__file__).resolve().parents[2]


class Captured(Transport):
    """Sentry's own transport interface, keeping envelopes in memory instead of sending."""

    def __init__(self, options=None):
        super().__init__(options)
        self.envelopes: list = []

    def capture_envelope(self, envelope) -> None:
        self.envelopes.append(envelope)


@pytest.fixture
def captured():
    transport = Captured()
    yield transport
    sentry_sdk.get_client().close()
    sentry_sdk.init(dsn=None)  # back to a client that sends nothing


def _events(transport: Captured) -> list[dict]:
    return [
        item.payload.json
        for envelope in transport.envelopes
        for item in envelope.items
        if item.type == "event"
    ]


def test_no_dsn_starts_nothing():
    assert error_reporting_init(dsn="", environment="test", release="0") is False


@pytest.mark.django_db
def test_an_unhandled_api_error_is_reported_without_personal_data(
    captured, shopper_client, monkeypatch
):
    assert error_reporting_init(
        dsn="https://public@errors.example.invalid/1",
        environment="test",
        release="test-release",
        transport=captured,
    )
    from inventory import selectors

    def boom():
        raise RuntimeError("reported bug")

    monkeypatch.setattr(selectors, "product_list", boom)
    shopper_client.raise_request_exception = False
    assert shopper_client.get("/api/v1/products/").status_code == 500
    sentry_sdk.flush(timeout=5)

    events = _events(captured)
    assert events, "no event reached the transport"
    text = repr(events)
    assert "reported bug" in text
    assert events[0]["release"] == "test-release"
    # PII off: no user, no address, no cookies or auth header.
    assert shopper_client.user.email not in text
    assert "127.0.0.1" not in text
    assert "Token " not in text
    assert events[0].get("user", {}).get("email") is None


def test_settings_start_it_when_sentry_dsn_is_set():
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))},
        "DJANGO_SETTINGS_MODULE": "config.settings.base",
        "SENTRY_DSN": "https://public@errors.example.invalid/1",
        "SHOP_ENV_FILE": os.devnull,
    }
    code = (
        "import django; django.setup(); import sentry_sdk; "
        "c = sentry_sdk.get_client(); print(c.is_active(), "
        "c.options['data_collection']['user_info'], "
        "sorted(i for i in c.integrations if i in ('django', 'celery')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "True False ['celery', 'django']"
