"""`manage.py check --deploy` is clean under the production settings, and their HTTPS defaults.

Each run is a subprocess with DJANGO_SETTINGS_MODULE=config.settings.production
and the variables production requires; the database and Redis are the test
run's (no embedded server is started).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Routes that need no database (the test database is not the URL the subprocess gets).
_INSPECT = """
import json, django
django.setup()
from django.conf import settings
from django.test import Client
names = ["DEBUG", "SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS",
         "SECURE_HSTS_PRELOAD", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE",
         "SECURE_CONTENT_TYPE_NOSNIFF", "X_FRAME_OPTIONS", "SECURE_REDIRECT_EXEMPT"]
out = {name: getattr(settings, name) for name in names}
out["SECURE_PROXY_SSL_HEADER"] = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
client = Client(HTTP_HOST="shop.example.com")
plain = client.get("/api/v1/auth/token/")
out["plain"] = [plain.status_code, plain.get("Location")]
proxied = client.get("/api/v1/auth/token/", HTTP_X_FORWARDED_PROTO="https")
out["proxied"] = [proxied.status_code, proxied.get("Strict-Transport-Security")]
secure = client.get("/api/v1/auth/token/", secure=True)
out["secure"] = [secure.status_code, secure.get("Strict-Transport-Security")]
out["healthz_plain"] = client.get("/healthz").status_code
print(json.dumps(out))
"""


def production_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.production",
        SECRET_KEY=secrets.token_urlsafe(60),
        PAYMENTS_WEBHOOK_SECRET=secrets.token_hex(32),
        PAYMENTS_PROVIDER_URL="https://provider.example.com",
        ALLOWED_HOSTS="shop.example.com",
        SHOP_ENV_FILE=os.devnull,  # no developer .env leaking into the check
    )
    env.update(extra)
    return env


def run(args, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=production_env(**extra),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_is_clean_under_production_settings():
    out = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "System check identified no issues (0 silenced)" in out.stdout, out.stdout


def test_check_deploy_fails_on_a_weak_secret_key():
    """The check is live: a short key is reported (the test above is not vacuous)."""
    out = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], SECRET_KEY="short")
    assert out.returncode != 0 and "security.W009" in out.stdout + out.stderr


def inspect(**extra: str) -> dict:
    out = run(["-c", _INSPECT], **extra)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_production_defaults_redirect_to_https_with_hsts_and_secure_cookies():
    found = inspect()
    assert found["DEBUG"] is False
    assert found["SECURE_SSL_REDIRECT"] and found["SESSION_COOKIE_SECURE"]
    assert found["CSRF_COOKIE_SECURE"] and found["SECURE_CONTENT_TYPE_NOSNIFF"]
    assert found["SECURE_HSTS_SECONDS"] >= 365 * 24 * 3600
    assert found["X_FRAME_OPTIONS"] == "DENY"
    # No proxy header trusted unless the operator says so: a client's own
    # X-Forwarded-Proto does not make plain HTTP look secure.
    assert found["SECURE_PROXY_SSL_HEADER"] is None
    assert found["plain"] == [301, "https://shop.example.com/api/v1/auth/token/"]
    assert found["proxied"][0] == 301
    assert found["secure"][0] == 405  # GET of a POST endpoint: past the redirect
    assert found["secure"][1] == "max-age=31536000; includeSubDomains; preload"
    # The load balancer's health check on plain HTTP is not redirected.
    assert found["healthz_plain"] in (200, 503)


def test_behind_a_proxy_the_forwarded_proto_header_is_trusted_when_configured():
    found = inspect(
        SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto,https",
        SECURE_HSTS_SECONDS="3600",
        SECURE_HSTS_PRELOAD="false",
    )
    assert found["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert found["proxied"] == [405, "max-age=3600; includeSubDomains"]
    assert found["plain"][0] == 301


def test_ssl_redirect_can_be_turned_off_for_a_proxy_that_redirects_itself():
    found = inspect(SECURE_SSL_REDIRECT="false", SECURE_HSTS_SECONDS="0")
    assert found["SECURE_SSL_REDIRECT"] is False
    assert found["plain"][0] == 405
