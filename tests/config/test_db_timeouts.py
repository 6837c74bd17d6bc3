"""A transaction its client abandoned does not hold its locks for ever (config/settings/base.py).

The chaos run's partitions left sessions idle in a transaction for minutes,
holding loyalty rows every later delivery waited on; the server now ends a
session idle inside a transaction past DB_IDLE_IN_TRANSACTION_TIMEOUT.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

HOLD_THEN_LOOK = """
import django, json, time
django.setup()
from django.db import connection, transaction
out = {"setting": None, "ended": False}
with connection.cursor() as cursor:
    cursor.execute("SHOW idle_in_transaction_session_timeout")
    out["setting"] = cursor.fetchone()[0]
try:
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        time.sleep(3)  # idle inside the transaction, as an abandoned client is
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
except Exception as exc:  # the server ended the session: any database error says so
    out["ended"] = True
    out["error"] = type(exc).__name__
print(json.dumps(out))
"""


@pytest.mark.django_db
def test_a_session_idle_in_a_transaction_is_ended_by_the_server():
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="config.settings.base",
        DB_POOL="false",
        DB_IDLE_IN_TRANSACTION_TIMEOUT="1",
        SHOP_ENV_FILE=os.devnull,
    )
    out = subprocess.run(
        [sys.executable, "-c", HOLD_THEN_LOOK],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["setting"] == "1s"
    assert result["ended"], result


def test_the_default_bound_is_a_minute_and_migrate_has_none():
    from django.conf import settings

    assert settings.DB_IDLE_IN_TRANSACTION_TIMEOUT == 60.0
    assert (
        "idle_in_transaction_session_timeout=60000"
        in (settings.DATABASES["default"]["OPTIONS"]["options"])
    )
    assert "migrate" in settings.DB_UNBOUNDED_COMMANDS
