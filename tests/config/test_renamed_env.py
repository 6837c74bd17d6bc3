"""A renamed environment variable still works under its old name, with one warning.

`IDEMPOTENCY_LOCK_TTL` / `_MARGIN` became `IDEMPOTENCY_LEASE_TTL` / `_MARGIN`
(docs/configuration.md, "Renamed variables"): a deployment that still sets the old name keeps
its value for one release and is told, once, which name to set instead.
"""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from config.settings import renamed as renamed_module
from config.settings.renamed import renamed

ROOT = Path(__file__).resolve().parents[2]

PRINT_LEASE = """
import json
from django.conf import settings
print(json.dumps([settings.IDEMPOTENCY_LEASE_TTL, settings.IDEMPOTENCY_LEASE_MARGIN]))
"""


def _settings_with(**env: str) -> tuple[list[float], str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("IDEMPOTENCY_")}
    # The checkout's .env (if any) must not leak into what is checked here.
    full.update(env, SHOP_ENV_FILE=os.devnull, DJANGO_SETTINGS_MODULE="config.settings.base")
    out = subprocess.run(
        [sys.executable, "-c", PRINT_LEASE],
        env=full,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(out.stdout), out.stderr


def test_the_old_environment_names_are_read_with_one_warning_each():
    values, stderr = _settings_with(IDEMPOTENCY_LOCK_TTL="42", IDEMPOTENCY_LOCK_MARGIN="7")
    assert values == [42.0, 7.0]
    assert stderr.count("IDEMPOTENCY_LOCK_TTL is deprecated: read as IDEMPOTENCY_LEASE_TTL") == 1
    assert stderr.count("IDEMPOTENCY_LOCK_MARGIN is deprecated") == 1


def test_the_new_name_wins_and_alone_warns_nothing():
    values, stderr = _settings_with(IDEMPOTENCY_LEASE_TTL="33", IDEMPOTENCY_LOCK_TTL="42")
    assert values == [33.0, 10.0]
    assert "IDEMPOTENCY_LOCK_TTL is deprecated and ignored" in stderr

    values, stderr = _settings_with(IDEMPOTENCY_LEASE_TTL="33")
    assert values == [33.0, 10.0]
    assert "deprecated" not in stderr


def test_the_warning_is_logged_once_however_often_the_name_is_asked(monkeypatch, caplog):
    monkeypatch.setattr(renamed_module, "_warned", set())
    monkeypatch.setenv("SHOP_OLD_NAME", "1")
    monkeypatch.delenv("SHOP_NEW_NAME", raising=False)
    with caplog.at_level(logging.WARNING, logger="config.settings"):
        assert [renamed("SHOP_NEW_NAME", old="SHOP_OLD_NAME") for _ in range(3)] == [
            "SHOP_OLD_NAME"
        ] * 3
    assert [r.getMessage() for r in caplog.records] == [
        "SHOP_OLD_NAME is deprecated: read as SHOP_NEW_NAME; set SHOP_NEW_NAME instead"
    ]


@pytest.mark.parametrize("name", ["IDEMPOTENCY_LOCK_TTL", "IDEMPOTENCY_LOCK_MARGIN"])
def test_the_settings_keep_only_the_new_name(settings, name):
    assert not hasattr(settings, name)
