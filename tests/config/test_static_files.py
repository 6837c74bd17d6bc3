"""Production static files: hashed names, compressed copies, a long cache for a hashed file.

collectstatic runs as the release step does (deploy/systemd/shop-release.service),
into a folder of the test's own (STATIC_ROOT); a production-settings process then
serves what it wrote through WhiteNoise.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SERVE = """
import json, django
django.setup()
from django.templatetags.static import static
from django.test import Client
client = Client()
found = {}
urls = {"hashed": static("admin/css/base.css"), "plain": "/static/admin/css/base.css"}
for name, url in urls.items():
    answer = client.get(
        url, secure=True, HTTP_HOST="shop.example.com", HTTP_ACCEPT_ENCODING="gzip"
    )
    found[name] = {
        "url": url,
        "status": answer.status_code,
        "cache": answer.get("Cache-Control", ""),
        "encoding": answer.get("Content-Encoding", ""),
    }
print(json.dumps(found))
"""


def _production_env(static_root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.production",
        SECRET_KEY=secrets.token_urlsafe(60),
        PAYMENTS_WEBHOOK_SECRET=secrets.token_hex(32),
        PAYMENTS_PROVIDER_URL="https://provider.example.com",
        ALLOWED_HOSTS="shop.example.com",
        SHOP_ENV_FILE=os.devnull,  # no developer .env
        STATIC_ROOT=str(static_root),
    )
    return env


@pytest.mark.slow
def test_a_hashed_static_file_is_cached_for_years_and_served_compressed(tmp_path):
    env = _production_env(tmp_path / "static")
    collected = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert collected.returncode == 0, collected.stderr
    assert (tmp_path / "static" / "staticfiles.json").is_file()  # the manifest

    served = subprocess.run(
        [sys.executable, "-c", SERVE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert served.returncode == 0, served.stderr
    found = json.loads(served.stdout.strip().splitlines()[-1])
    hashed, plain = found["hashed"], found["plain"]
    # {% static %} names the hashed copy: base.<12 hex>.css.
    assert hashed["url"] != plain["url"] and hashed["url"].endswith(".css")
    assert hashed["status"] == 200 and plain["status"] == 200
    assert "immutable" in hashed["cache"]
    assert "max-age=315360000" in hashed["cache"]  # ten years
    assert "immutable" not in plain["cache"] and "max-age=60" in plain["cache"]
    assert hashed["encoding"] == "gzip"
