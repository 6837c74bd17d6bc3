"""Production settings: everything secret or host-specific must come from the environment.

Loading them with any of `REQUIRED` unset (or empty) stops the process at
start with one message naming every missing variable: a production host never
falls back to the development defaults of `base` (a local database, a dev
secret key, the loopback host names). `manage.py` never starts embedded
servers under these settings (runner/manage.py).
"""

from django.core.exceptions import ImproperlyConfigured

# `base` reads the checkout's `.env` into the environment before anything else,
# so a variable set there counts; checked before any of base's development
# defaults could stand in for it.
from .base import *  # noqa: F401,F403
from .base import DEVELOPMENT_APPS, INSTALLED_APPS, env
from .email_url import email_settings
from .required import missing_required

if _missing := missing_required():
    raise ImproperlyConfigured(
        "production settings need these environment variables, which are not set: "
        + ", ".join(_missing)
        + " (docs/deployment.md, 'Production settings')"
    )

# No development component (devtools/): no demo data command on a production host.
INSTALLED_APPS = [app for app in INSTALLED_APPS if app not in DEVELOPMENT_APPS]

SECRET_KEY = env.str("SECRET_KEY")
# The provider's webhooks are authenticated by this secret alone: no default.
PAYMENTS_WEBHOOK_SECRET = env.str("PAYMENTS_WEBHOOK_SECRET")
# The provider's address: no simulator default here. Unset, the system check
# payments.E001 (payments/checks.py) fails `migrate` and `release`, so the
# release step every process starts after fails, and none of them starts
# (docs/deployment.md).
PAYMENTS_PROVIDER_URL = env.str("PAYMENTS_PROVIDER_URL", default="")
DEBUG = False
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=True)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=True)

# --- HTTPS (docs/security.md): every default is the safe one; each is env-overridable.
# Behind a TLS-terminating proxy set SECURE_PROXY_SSL_HEADER=X-Forwarded-Proto,https, and
# only if that proxy always sets (never passes through) the header.
_proxy_ssl_header = env.list("SECURE_PROXY_SSL_HEADER", default=[])
if _proxy_ssl_header:
    _name, _value = _proxy_ssl_header
    SECURE_PROXY_SSL_HEADER = (f"HTTP_{_name.strip().upper().replace('-', '_')}", _value.strip())
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
# Load-balancer health checks and the host's scraper speak plain HTTP on the host.
SECURE_REDIRECT_EXEMPT = env.list(
    "SECURE_REDIRECT_EXEMPT", default=[r"^livez$", r"^healthz$", r"^metrics$"]
)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=365 * 24 * 3600)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=True)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=True)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = env.str("SECURE_REFERRER_POLICY", default="same-origin")
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True

# --- Static files: hashed names from collectstatic's manifest, compressed; WhiteNoise
# serves a hashed file with a ten-year `Cache-Control: max-age, immutable` (its name
# changes with its content) and any other with WHITENOISE_MAX_AGE (60 s). The release
# step runs collectstatic before any process starts (deploy/systemd/shop-release.service).
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

# --- Mail: EMAIL_URL, SMTP on this host's port 25 when unset (its local relay).
globals().update(email_settings(default="smtp://localhost:25"))
