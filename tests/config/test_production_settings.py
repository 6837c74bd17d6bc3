"""Production settings cannot start wrong: every required variable, and no embedded server.

Each check is a subprocess under DJANGO_SETTINGS_MODULE=config.settings.production,
with no developer `.env` (SHOP_ENV_FILE=/dev/null) and a `var/` of its own, so
an embedded server started by mistake would leave its folder behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from config.settings.required import REQUIRED

ROOT = Path(__file__).resolve().parents[2]

FULL = {
    "DATABASE_URL": "postgres://shop@db.example.internal:5432/shop",
    "REDIS_URL": "redis://redis.example.internal:6379/0",
    "ALLOWED_HOSTS": "shop.example.com",
    "SECRET_KEY": "production-settings-test-" + "x" * 40,
    "PAYMENTS_WEBHOOK_SECRET": "whsec_production_settings_test",
}


def _env(tmp_path: Path, **values: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "PYTEST_"))
        and k not in REQUIRED
        and k != "PAYMENTS_PROVIDER_URL"
    }
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.production",
        SHOP_ENV_FILE=os.devnull,
        SHOP_VAR_DIR=str(tmp_path / "var"),
    )
    env.update(values)
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


_LOAD = ["-c", "import django; django.setup(); print('loaded')"]


def test_all_required_variables_set_the_settings_load(tmp_path):
    out = _run(_LOAD, _env(tmp_path, **FULL))
    assert out.returncode == 0, out.stderr
    assert "loaded" in out.stdout


@pytest.mark.parametrize("name", REQUIRED)
def test_each_missing_variable_stops_the_start_with_its_name(tmp_path, name):
    values = {k: v for k, v in FULL.items() if k != name}
    out = _run(_LOAD, _env(tmp_path, **values))
    assert out.returncode != 0
    assert "ImproperlyConfigured" in out.stderr
    assert f"which are not set: {name} " in out.stderr, out.stderr


def test_an_empty_variable_counts_as_missing_and_all_missing_are_named_at_once(tmp_path):
    out = _run(_LOAD, _env(tmp_path, SECRET_KEY="  "))
    assert out.returncode != 0
    assert "which are not set: " + ", ".join(REQUIRED) in out.stderr, out.stderr


def test_manage_migrate_without_database_url_fails_and_embeds_nothing(tmp_path):
    values = {k: v for k, v in FULL.items() if k != "DATABASE_URL"}
    out = _run(["manage.py", "migrate", "--noinput"], _env(tmp_path, **values))
    assert out.returncode != 0
    assert "DATABASE_URL" in out.stderr
    assert "embedded" not in out.stderr
    # An embedded PostgreSQL would have made its data folder under var/.
    assert not (tmp_path / "var").exists() or not any((tmp_path / "var").iterdir())


def test_manage_with_settings_flag_is_production_too(tmp_path):
    """`--settings=config.settings.production` is taken like the environment variable."""
    env = _env(tmp_path)
    env["DJANGO_SETTINGS_MODULE"] = "config.settings.base"
    out = _run(["manage.py", "check", "--settings=config.settings.production"], env)
    assert out.returncode != 0
    assert "which are not set: DATABASE_URL" in out.stderr, out.stderr
    assert not (tmp_path / "var").exists() or not any((tmp_path / "var").iterdir())


_CHECK = ["manage.py", "check"]
PROVIDER = {"PAYMENTS_PROVIDER_URL": "https://provider.example.com"}


def test_without_a_provider_url_the_system_check_refuses_production(tmp_path):
    """No simulator default under production settings: payments.E001 fails `check` and
    `release` (the release step's migrate); the development settings, the wrong twin here,
    pass."""
    out = _run(_CHECK, _env(tmp_path, **FULL))
    assert out.returncode != 0
    assert "payments.E001" in out.stderr and "PAYMENTS_PROVIDER_URL" in out.stderr, out.stderr
    here = {**FULL, "DATABASE_URL": os.environ["DATABASE_URL"]}
    release = _run(["manage.py", "release"], _env(tmp_path, **here))
    assert release.returncode != 0 and "payments.E001" in release.stderr, release.stderr
    blank = _run(_CHECK, _env(tmp_path, **FULL, PAYMENTS_PROVIDER_URL="  "))
    assert "payments.E001" in blank.stderr, blank.stderr
    told = _run(_CHECK, _env(tmp_path, **FULL, **PROVIDER))
    assert told.returncode == 0, told.stderr
    development = _env(tmp_path, **FULL, DJANGO_SETTINGS_MODULE="config.settings.base")
    out = _run(["-c", _SETTING], development)
    assert out.stdout.strip() == "http://127.0.0.1:8470", out.stderr


_SETTING = (
    "import django; django.setup(); from django.conf import settings;"
    " from django.core import checks;"
    " assert not [e for e in checks.run_checks() if e.id == 'payments.E001'];"
    " print(settings.PAYMENTS_PROVIDER_URL)"
)
