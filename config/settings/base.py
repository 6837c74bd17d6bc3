"""Settings shared by every environment; values come from the environment.

`DATABASE_URL` and `REDIS_URL` name the PostgreSQL and Redis servers (from the
environment or a `.env` file in the checkout). When they are not set the run
command, `manage.py` and the test suite start embedded servers and set them
before Django loads (see docs/running.md); settings never start anything.
"""

import tomllib
from datetime import date
from typing import Any, cast

from config.settings.renamed import renamed

# Split by concern; every name they define is a setting of this module too.
from .celery import *  # noqa: F403
from .celery import (
    CELERY_BEAT_SCHEDULE,
    CELERY_TASK_TIME_LIMIT,
    CELERY_UNACKED_RESTORE_INTERVAL,
    CELERY_VISIBILITY_TIMEOUT,
    DUE_ATTEMPT_MARGIN,
    _beat_every,
)
from .email_url import email_settings
from .environment import BASE_DIR, env
from .servers import *  # noqa: F403

# The shop's one version, from pyproject.toml's [project] (the OpenAPI document shows it).
SHOP_VERSION: str = tomllib.loads((BASE_DIR / "pyproject.toml").read_text())["project"]["version"]


SECRET_KEY = env.str("SECRET_KEY", default="dev-insecure-change-me")
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

# Development only (devtools/, docs/running.md): the demo data's `manage.py seed_demo`.
# The development and test settings install them; production.py takes them out.
DEVELOPMENT_APPS = ["devtools.demo"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "core",
    "idempotency",
    "inventory",
    "payments",
    "orders",
    "reports",
    "shop",
    "backoffice",
    *DEVELOPMENT_APPS,
]

MIDDLEWARE = [
    # First: the request id and log context, and the request metrics (docs/operations.md).
    "core.middleware.RequestIdMiddleware",
    "core.middleware.RequestMetricsMiddleware",
    # Before anything that may wait on the database (docs/failure-model.md).
    "core.deadline.RequestDeadlineMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "core.problems.ProblemMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # The shopper's language: the session's choice, else Accept-Language; the API
    # stays in English (core.middleware.LocaleMiddleware; docs/storefront.md).
    "core.middleware.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# Django's database sessions with their end written and checked by the database
# clock, which every host shares (core/sessions.py; docs/failure-model.md).
SESSION_ENGINE = "core.sessions"
# A session ends this long after its last save (Django's default, named here: the
# inbox's retention depends on it); beat deletes ended ones (docs/operations.md,
# "Retention") in bounded batches.
SESSION_COOKIE_AGE = env.int("SESSION_COOKIE_AGE", default=14 * 24 * 3600)
SESSION_CLEAR_EVERY = env.float("SESSION_CLEAR_EVERY", default=3600.0)
SESSION_CLEAR_BATCH = env.int("SESSION_CLEAR_BATCH", default=5000)
SESSION_CLEAR_MAX_BATCHES = env.int("SESSION_CLEAR_MAX_BATCHES", default=50)
CELERY_BEAT_SCHEDULE["core.clear_expired_sessions"] = _beat_every(
    "core.clear_expired_sessions", SESSION_CLEAR_EVERY
)

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django.template.context_processors.i18n",
            ],
        },
    },
]


# --- Auth -------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# The storefront's log-in page (the admin keeps its own at /admin/login/).
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"

# --- DRF --------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first so that an unauthenticated API call answers 401 with a
        # WWW-Authenticate header rather than 403.
        "core.authentication.ExpiringTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_PAGINATION_CLASS": "core.pagination.CursorPage",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "core.problems.drf_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "core.schema.ShopAutoSchema",
    "DEFAULT_THROTTLE_RATES": {
        "auth_token": env.str("SHOP_TOKEN_THROTTLE_RATE", default="10/min"),
        "register": env.str("SHOP_REGISTER_THROTTLE_RATE", default="30/min"),
    },
    "COERCE_DECIMAL_TO_STRING": True,
    # Throttles identify a client by REMOTE_ADDR, or by the X-Forwarded-For entry this
    # many proxies back. Never DRF's default (None: the whole header, which any client
    # can forge to get a fresh per-address budget per request). docs/security.md.
    "NUM_PROXIES": env.int("SHOP_NUM_PROXIES", default=0),
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

# An API token authenticates for this long after it was issued (database clock),
# then answers 401 and the client asks POST /api/v1/auth/token/ again; the purge
# (shop.purge_api_tokens, every API_TOKEN_PURGE_EVERY seconds) deletes the rows
# past it. docs/security.md, "API tokens".
API_TOKEN_LIFETIME = env.int("API_TOKEN_LIFETIME", default=30 * 24 * 3600)
API_TOKEN_PURGE_EVERY = env.float("API_TOKEN_PURGE_EVERY", default=3600.0)

SPECTACULAR_SETTINGS: dict[str, Any] = {
    "TITLE": "Shop API",
    "DESCRIPTION": "Exactly-once effects on at-least-once infrastructure.",
    "VERSION": SHOP_VERSION,
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
}

# --- Requests ---------------------------------------------------------------
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("DATA_UPLOAD_MAX_MEMORY_SIZE", default=256 * 1024)

# --- The shop ----------------------------------------------------------------
SHOP_CURRENCY = env.str("SHOP_CURRENCY", default="EUR")
# Loyalty keeps the ids of the events it applied this long (seconds, database
# clock), then forgets them: longer than the outbox keeps a message plus the
# longest a copy can still be redelivered, or a late copy earns twice
# (docs/events.md). Trimmed by age only, never by count.
LOYALTY_APPLIED_IDS_RETENTION = env.float("LOYALTY_APPLIED_IDS_RETENTION", default=30 * 24 * 3600.0)
PROBLEM_TYPE_BASE = env.str("PROBLEM_TYPE_BASE", default="https://shop.example/problems/")

# --- Idempotency: request keys, completer, purge, failpoints (issue 4) ---------
# See docs/idempotency.md. Times are seconds, judged by the database clock.
# The lease TTL must exceed the longest gap between two lease renewals: one
# phase plus one outside call (provider timeout x in-request attempts + margin).
# Formerly IDEMPOTENCY_LOCK_TTL / _MARGIN: the old names are still read (warned).
IDEMPOTENCY_LEASE_TTL = env.float(
    renamed("IDEMPOTENCY_LEASE_TTL", old="IDEMPOTENCY_LOCK_TTL"), default=60.0
)
IDEMPOTENCY_LEASE_MARGIN = env.float(
    renamed("IDEMPOTENCY_LEASE_MARGIN", old="IDEMPOTENCY_LOCK_MARGIN"), default=10.0
)
# Longest wait (seconds) of a fresh key's INSERT on a concurrent identical request's
# uncommitted row (its phase 1 may queue behind a busy stock row); then 409 in use.
IDEMPOTENCY_CLAIM_WAIT = env.float("IDEMPOTENCY_CLAIM_WAIT", default=0.5)
# Retry-After of a 409 idempotency_key_in_use (capped by the lease's remaining life).
IDEMPOTENCY_RETRY_AFTER = env.int("IDEMPOTENCY_RETRY_AFTER", default=1)
# An open key not retried for this long (and not leased) is completed by the completer.
IDEMPOTENCY_ABANDON_AFTER = env.float("IDEMPOTENCY_ABANDON_AFTER", default=300.0)
IDEMPOTENCY_COMPLETER_BATCH = env.int("IDEMPOTENCY_COMPLETER_BATCH", default=50)
# Seconds after which a completer run starts no further key (each may call the
# provider): with one key's calls on top it stays under the task's soft limit.
IDEMPOTENCY_COMPLETER_BUDGET = env.float(
    "IDEMPOTENCY_COMPLETER_BUDGET", default=CELERY_VISIBILITY_TIMEOUT / 4
)
# The outbox is due work (core.due): the relay's attempt budget, backoff and lease.
OUTBOX_RELAY_MAX_ATTEMPTS = env.int("OUTBOX_RELAY_MAX_ATTEMPTS", default=20)
OUTBOX_RELAY_BACKOFF_BASE = env.float("OUTBOX_RELAY_BACKOFF_BASE", default=1.0)
OUTBOX_RELAY_BACKOFF_MAX = env.float("OUTBOX_RELAY_BACKOFF_MAX", default=300.0)
OUTBOX_RELAY_LEASE = env.float("OUTBOX_RELAY_LEASE", default=CELERY_VISIBILITY_TIMEOUT + 30)
# The relay (docs/events.md): batch size, how long the relay process sleeps
# when the outbox is empty, and the beat fallback's interval.
OUTBOX_RELAY_BATCH = env.int("OUTBOX_RELAY_BATCH", default=500)
OUTBOX_RELAY_POLL = env.float("OUTBOX_RELAY_POLL", default=0.1)
OUTBOX_RELAY_EVERY = env.float("OUTBOX_RELAY_EVERY", default=10.0)
# The pipeline's lag target (outbox row written -> delivery done, p99), and the relay's
# linger: a batch short of a ring waits up to OUTBOX_RELAY_LINGER seconds for more rows,
# only while its oldest row stays younger than OUTBOX_RELAY_LINGER_SHARE of the target
# (docs/events.md, "The relay"). 0: never linger.
OUTBOX_LAG_TARGET = env.float("OUTBOX_LAG_TARGET", default=2.0)
OUTBOX_RELAY_LINGER = env.float("OUTBOX_RELAY_LINGER", default=0.05)
OUTBOX_RELAY_LINGER_SHARE = env.float("OUTBOX_RELAY_LINGER_SHARE", default=0.1)
# Deliveries one consumer task claims and applies in one transaction (docs/events.md,
# "Batched consumers"): one broker message rings for this many.
OUTBOX_CONSUMER_BATCH = env.int("OUTBOX_CONSUMER_BATCH", default=200)
# A published delivery not done after this long is published again (docs/celery.md):
# the longest a live copy can still be on its way (visibility timeout + restore
# sweep + one run of the task; on RabbitMQ two missed heartbeats + one run, less).
OUTBOX_DELIVERY_TIMEOUT = env.float(
    "OUTBOX_DELIVERY_TIMEOUT",
    default=CELERY_VISIBILITY_TIMEOUT + CELERY_UNACKED_RESTORE_INTERVAL + CELERY_TASK_TIME_LIMIT,
)
OUTBOX_DELIVERY_MAX_ATTEMPTS = env.int("OUTBOX_DELIVERY_MAX_ATTEMPTS", default=8)
OUTBOX_DELIVERY_BACKOFF_BASE = env.float("OUTBOX_DELIVERY_BACKOFF_BASE", default=1.0)
OUTBOX_DELIVERY_BACKOFF_MAX = env.float("OUTBOX_DELIVERY_BACKOFF_MAX", default=300.0)
# The relay process sweeps overdue deliveries this often; beat does too (fallback).
OUTBOX_DELIVERY_SWEEP_SECONDS = env.float("OUTBOX_DELIVERY_SWEEP_SECONDS", default=5.0)
# Published messages whose deliveries are all done are purged after this long
# (must stay below LOYALTY_APPLIED_IDS_RETENTION minus the redelivery window).
OUTBOX_RETENTION = env.float("OUTBOX_RETENTION", default=7 * 24 * 3600.0)
OUTBOX_PURGE_BATCH = env.int("OUTBOX_PURGE_BATCH", default=1000)
OUTBOX_PURGE_MAX_BATCHES = env.int("OUTBOX_PURGE_MAX_BATCHES", default=50)
OUTBOX_PURGE_EVERY = env.float("OUTBOX_PURGE_EVERY", default=3600.0)
CELERY_BEAT_SCHEDULE["idempotency-relay-outbox"] = _beat_every(
    "idempotency.relay_outbox", OUTBOX_RELAY_EVERY
)
CELERY_BEAT_SCHEDULE["idempotency-sweep-deliveries"] = _beat_every(
    "idempotency.sweep_deliveries", OUTBOX_RELAY_EVERY
)
CELERY_BEAT_SCHEDULE["idempotency-purge-outbox"] = _beat_every(
    "idempotency.purge_outbox", OUTBOX_PURGE_EVERY
)
# The inbox keeps a consumer's ids this long (received_at, database clock), then
# beat deletes them: never shorter than a copy of an event can arrive (the outbox's
# retention plus the redelivery window) nor than a session holding a guest cart's id
# lives (docs/operations.md, "Retention"). Provider events stored `unmatched` stay.
IDEMPOTENCY_INBOX_RETENTION = max(
    env.float("IDEMPOTENCY_INBOX_RETENTION", default=30 * 24 * 3600.0),
    OUTBOX_RETENTION + OUTBOX_DELIVERY_TIMEOUT,
    float(SESSION_COOKIE_AGE),
)
IDEMPOTENCY_INBOX_PURGE_BATCH = env.int("IDEMPOTENCY_INBOX_PURGE_BATCH", default=1000)
IDEMPOTENCY_INBOX_PURGE_MAX_BATCHES = env.int("IDEMPOTENCY_INBOX_PURGE_MAX_BATCHES", default=50)
IDEMPOTENCY_INBOX_PURGE_EVERY = env.float("IDEMPOTENCY_INBOX_PURGE_EVERY", default=3600.0)
CELERY_BEAT_SCHEDULE["idempotency-purge-inbox"] = _beat_every(
    "idempotency.purge_inbox", IDEMPOTENCY_INBOX_PURGE_EVERY
)
IDEMPOTENCY_COMPLETER_EVERY = env.float("IDEMPOTENCY_COMPLETER_EVERY", default=60.0)
# A purge run deletes at most BATCH x MAX_BATCHES keys and starts no batch after BUDGET
# seconds; every minute that is 833 keys/s while a batch takes under 0.03 s, over 4 x
# the keyed orders a second the shop is built for (docs/performance.md, "The key purge").
IDEMPOTENCY_PURGE_EVERY = env.float("IDEMPOTENCY_PURGE_EVERY", default=60.0)
# Finished keys are kept at least this long (published retention: 24 h), then purged.
IDEMPOTENCY_KEY_RETENTION = env.float("IDEMPOTENCY_KEY_RETENTION", default=24 * 3600.0)
IDEMPOTENCY_PURGE_BATCH = env.int("IDEMPOTENCY_PURGE_BATCH", default=1000)
IDEMPOTENCY_PURGE_MAX_BATCHES = env.int("IDEMPOTENCY_PURGE_MAX_BATCHES", default=50)
# The purge pauses after each full batch this many times as long as the batch took
# (0: no pause): it uses at most 1 / (1 + pace) of one connection, whatever its backlog
# (docs/performance.md, "The key purge").
IDEMPOTENCY_PURGE_PACE = env.float("IDEMPOTENCY_PURGE_PACE", default=9.0)
# A purge run starts no batch after this many seconds: it ends well within the task's
# soft time limit, as the completer's budget does.
IDEMPOTENCY_PURGE_BUDGET = env.float(
    "IDEMPOTENCY_PURGE_BUDGET", default=CELERY_VISIBILITY_TIMEOUT / 4
)
CELERY_BEAT_SCHEDULE["idempotency-complete-abandoned-keys"] = _beat_every(
    "idempotency.complete_abandoned_keys", IDEMPOTENCY_COMPLETER_EVERY
)
CELERY_BEAT_SCHEDULE["idempotency-purge-finished-keys"] = _beat_every(
    "idempotency.purge_finished_keys", IDEMPOTENCY_PURGE_EVERY
)

# --- i18n, static ------------------------------------------------------------
# The storefront, its e-mails and the admin speak these languages; the API answers
# in English whatever the request asks (docs/storefront.md, "Languages").
LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("fr", "Français")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
# collectstatic's folder: the checkout's staticfiles/, which WhiteNoise serves.
STATIC_ROOT = env.str("STATIC_ROOT", default="") or BASE_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# Structured logs (core/logging.py, docs/operations.md): one JSON object per
# line with the request id, user id, key hash and order id; `LOG_FORMAT=text`
# renders the same fields for humans.
LOG_FORMAT = env.str("LOG_FORMAT", default="json")
if LOG_FORMAT not in ("json", "text"):
    raise ValueError(f"LOG_FORMAT must be json or text, not {LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "core.logging.JsonFormatter"},
        "text": {"()": "core.logging.TextFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {"django.request": {"level": "ERROR"}},
}
# Celery workers log through LOGGING above instead of their own root handler.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# --- Payments (see docs/payments.md) -----------------------------------------
# The provider: the simulator (`python -m devtools.simulator`) by default.
PAYMENTS_GATEWAY = env.str(
    "PAYMENTS_GATEWAY", default="payments.gateway.simulator.SimulatorGateway"
)
PAYMENTS_PROVIDER_URL = env.str("PAYMENTS_PROVIDER_URL", default="http://127.0.0.1:8470")
# Seconds a provider call may take (connect, then each read) before its outcome is unknown.
PAYMENTS_PROVIDER_TIMEOUT = env.float("PAYMENTS_PROVIDER_TIMEOUT", default=5.0)
# Dotted path of handler(*, payment, outcome) called inside the transaction that
# records a settled outcome ("captured" | "declined"); set by the orders area.
PAYMENTS_SETTLED_HANDLER: str | None = None
# Settlement of unknown outcomes: delays in seconds, judged by the database clock.
PAYMENTS_SETTLE_GRACE = env.float(
    "PAYMENTS_SETTLE_GRACE", default=PAYMENTS_PROVIDER_TIMEOUT + 5
)  # first look at a call whose caller never came back
PAYMENTS_SETTLE_FIRST_DELAY = env.float("PAYMENTS_SETTLE_FIRST_DELAY", default=2.0)
PAYMENTS_SETTLE_BACKOFF_BASE = env.float("PAYMENTS_SETTLE_BACKOFF_BASE", default=2.0)
PAYMENTS_SETTLE_BACKOFF_MAX = env.float("PAYMENTS_SETTLE_BACKOFF_MAX", default=300.0)
PAYMENTS_SETTLE_MAX_ATTEMPTS = env.int("PAYMENTS_SETTLE_MAX_ATTEMPTS", default=12)
PAYMENTS_SETTLE_LEASE = env.float("PAYMENTS_SETTLE_LEASE", default=CELERY_VISIBILITY_TIMEOUT + 30)
# Shared secret of the provider's webhook signatures (`Shop-Signature`). Required in
# production settings; unset in development, `make run` generates one per install
# (var/webhook-secret) and gives it to the web processes and the simulator.
PAYMENTS_WEBHOOK_SECRET = env.str("PAYMENTS_WEBHOOK_SECRET", default="")
PAYMENTS_SWEEP_INTERVAL = env.float("PAYMENTS_SWEEP_INTERVAL", default=5.0)
PAYMENTS_SWEEP_BATCH = env.int("PAYMENTS_SWEEP_BATCH", default=100)
CELERY_BEAT_SCHEDULE["payments.sweep_settlements"] = _beat_every(
    "payments.sweep_settlements", PAYMENTS_SWEEP_INTERVAL
)
# Refunds (docs/payments.md, "Refunds"): due rows rung after commit, swept by beat.
PAYMENTS_REFUND_BACKOFF_BASE = env.float("PAYMENTS_REFUND_BACKOFF_BASE", default=2.0)
PAYMENTS_REFUND_BACKOFF_MAX = env.float("PAYMENTS_REFUND_BACKOFF_MAX", default=300.0)
PAYMENTS_REFUND_MAX_ATTEMPTS = env.int("PAYMENTS_REFUND_MAX_ATTEMPTS", default=12)
PAYMENTS_REFUND_LEASE = env.float("PAYMENTS_REFUND_LEASE", default=CELERY_VISIBILITY_TIMEOUT + 30)
CELERY_BEAT_SCHEDULE["payments.sweep_refunds"] = _beat_every(
    "payments.sweep_refunds", PAYMENTS_SWEEP_INTERVAL
)

# --- Checkout: orders and reservation flags (issue 6) --------------------------
# How long an `ask` order's flags are held while the shopper decides.
ORDER_RESERVATION_TTL_SECONDS = env.int("ORDER_RESERVATION_TTL_SECONDS", default=15 * 60)
# Dotted path of handler(*, scope, kept, ordered) called inside the transaction that
# keeps or ends an order placed with a business scope; set by the shop area.
ORDERS_SCOPE_HANDLER: str | None = None
# How often beat sweeps `awaiting_decision` orders past their expiry.
ORDER_EXPIRY_SWEEP_SECONDS = env.int("ORDER_EXPIRY_SWEEP_SECONDS", default=30)
# Orders expired per sweep run (each in its own transaction).
ORDER_EXPIRY_BATCH = env.int("ORDER_EXPIRY_BATCH", default=500)
# Limits per shopper on new orders (docs/checkout.md, "Limits per shopper"): orders
# placed in any minute, and orders awaiting a decision or a payment outcome at once.
ORDER_PLACE_PER_MINUTE = env.int("ORDER_PLACE_PER_MINUTE", default=20)
ORDER_HOLDING_MAX = env.int("ORDER_HOLDING_MAX", default=3)
CELERY_BEAT_SCHEDULE["orders.expire_reservations"] = _beat_every(
    "orders.expire_reservations", ORDER_EXPIRY_SWEEP_SECONDS
)
# The daily sales report (docs/reports.md, "Every closed day, once (catch-up)"): a due
# row per closed day in TIME_ZONE (reports.models.ReportDay); beat's run makes every
# day not yet published, oldest first. A tick lost in an outage costs one interval.
REPORTS_RUN_EVERY = env.float("REPORTS_RUN_EVERY", default=300.0)
# The run starts no further day after this long (one day's three steps run in the task).
REPORTS_RUN_BUDGET = env.float("REPORTS_RUN_BUDGET", default=CELERY_VISIBILITY_TIMEOUT / 4)
# A closed day is made this long after its end: a transaction that began before
# midnight and commits after it is counted in its day by then.
REPORTS_DAY_GRACE = env.float("REPORTS_DAY_GRACE", default=1800.0)
# The first day reported (YYYY-MM-DD); unset: the day of the first order (or of the
# oldest report or report day, if earlier).
REPORTS_FIRST_DAY: date | None = (
    date.fromisoformat(env.str("REPORTS_FIRST_DAY"))
    if env.str("REPORTS_FIRST_DAY", default="")
    else None
)
REPORTS_DAY_MAX_ATTEMPTS = env.int("REPORTS_DAY_MAX_ATTEMPTS", default=5)
REPORTS_DAY_BACKOFF_BASE = env.float("REPORTS_DAY_BACKOFF_BASE", default=60.0)
REPORTS_DAY_BACKOFF_MAX = env.float("REPORTS_DAY_BACKOFF_MAX", default=3600.0)
REPORTS_DAY_LEASE = env.float("REPORTS_DAY_LEASE", default=CELERY_VISIBILITY_TIMEOUT + 30)
REPORTS_DAY_ATTEMPT_LEASE = env.float(
    "REPORTS_DAY_ATTEMPT_LEASE", default=CELERY_TASK_TIME_LIMIT + DUE_ATTEMPT_MARGIN
)
CELERY_BEAT_SCHEDULE["reports.make_days"] = _beat_every("reports.make_days", REPORTS_RUN_EVERY)
# Compensation (docs/compensation.md): a received return's or a cancelled order's
# steps are due rows (core.due), rung after commit and swept by beat.
COMPENSATION_MAX_ATTEMPTS = env.int("COMPENSATION_MAX_ATTEMPTS", default=10)
COMPENSATION_BACKOFF_BASE = env.float("COMPENSATION_BACKOFF_BASE", default=2.0)
COMPENSATION_BACKOFF_MAX = env.float("COMPENSATION_BACKOFF_MAX", default=300.0)
COMPENSATION_LEASE = env.float("COMPENSATION_LEASE", default=CELERY_VISIBILITY_TIMEOUT + 30)
# One step attempt's lease: a step calls no provider, and its e-mail has no timeout
# of its own, so the worker's hard time limit is what bounds a running attempt.
COMPENSATION_ATTEMPT_LEASE = env.float(
    "COMPENSATION_ATTEMPT_LEASE", default=CELERY_TASK_TIME_LIMIT + DUE_ATTEMPT_MARGIN
)
# How soon a step waiting for its refund looks again.
COMPENSATION_WAIT_SECONDS = env.float("COMPENSATION_WAIT_SECONDS", default=5.0)
# A step waiting for the step it follows is made due and rung by that step's done
# transaction; it looks again by itself only after this long (a safety net).
COMPENSATION_AFTER_RECHECK = env.float("COMPENSATION_AFTER_RECHECK", default=60.0)
# A step behind one that needs staff is parked, not polled: it is made due when
# that step is done; this long re-check is only a safety net.
COMPENSATION_PARKED_RECHECK = env.float("COMPENSATION_PARKED_RECHECK", default=3600.0)
# A cancellation's refund waits for the order's refunds in progress; while one needs
# staff it is not polled by bells, the sweeper looks again after this long.
COMPENSATION_REFUND_HELD_RECHECK = env.float("COMPENSATION_REFUND_HELD_RECHECK", default=60.0)
COMPENSATION_SWEEP_INTERVAL = env.float("COMPENSATION_SWEEP_INTERVAL", default=5.0)
COMPENSATION_SWEEP_BATCH = env.int("COMPENSATION_SWEEP_BATCH", default=100)
CELERY_BEAT_SCHEDULE["orders.sweep_compensation"] = _beat_every(
    "orders.sweep_compensation", COMPENSATION_SWEEP_INTERVAL
)
# Where mail goes (the notify step's, the shopper e-mails', password resets'):
# EMAIL_URL (config/settings/email_url.py); printed to the console by default,
# make run writes it to var/mail/, production's default is SMTP on localhost.
_EMAIL = email_settings(default="console://")
globals().update(_EMAIL)
# One send's total deadline (EMAIL_URL's ?deadline=, twice the timeout by default): the
# SMTP backend (core/mail.py) bounds every socket operation by what is left of it, and a
# mail's attempt lease covers it (docs/events.md, "Shopper e-mails").
EMAIL_SEND_DEADLINE = float(cast(float, _EMAIL["EMAIL_SEND_DEADLINE"]))
# The shopper e-mails consumer (shop/emails.py) is registered with the relay.
SHOP_EMAILS = env.bool("SHOP_EMAILS", default=True)
# Ids per e-mails ring (docs/events.md, "Shopper e-mails"): the consumer writes one mail
# row per event in the batch's transaction, like loyalty and history.
SHOP_EMAILS_BATCH = env.int("SHOP_EMAILS_BATCH", default=200)
# Sending a mail row (shop.send_mail) is due work (core.due): budget, backoff, lease.
SHOP_MAIL_MAX_ATTEMPTS = env.int("SHOP_MAIL_MAX_ATTEMPTS", default=10)
SHOP_MAIL_BACKOFF_BASE = env.float("SHOP_MAIL_BACKOFF_BASE", default=5.0)
SHOP_MAIL_BACKOFF_MAX = env.float("SHOP_MAIL_BACKOFF_MAX", default=600.0)
SHOP_MAIL_LEASE = env.float("SHOP_MAIL_LEASE", default=CELERY_VISIBILITY_TIMEOUT + 30)
# Mails one task sends over one connection (the consumer's ring, the sweeper's batch).
SHOP_MAIL_SEND_BATCH = env.int("SHOP_MAIL_SEND_BATCH", default=50)
SHOP_MAIL_SWEEP_BATCH = env.int("SHOP_MAIL_SWEEP_BATCH", default=500)
SHOP_MAIL_SWEEP_INTERVAL = env.float("SHOP_MAIL_SWEEP_INTERVAL", default=5.0)
CELERY_BEAT_SCHEDULE["shop.sweep_mail"] = _beat_every("shop.sweep_mail", SHOP_MAIL_SWEEP_INTERVAL)
# Sent mails are kept this long (never shorter than OUTBOX_RETENTION), then purged.
SHOP_MAIL_RETENTION = max(
    env.float("SHOP_MAIL_RETENTION", default=30 * 24 * 3600.0), OUTBOX_RETENTION
)
SHOP_MAIL_PURGE_BATCH = env.int("SHOP_MAIL_PURGE_BATCH", default=1000)
SHOP_MAIL_PURGE_MAX_BATCHES = env.int("SHOP_MAIL_PURGE_MAX_BATCHES", default=50)
SHOP_MAIL_PURGE_EVERY = env.float("SHOP_MAIL_PURGE_EVERY", default=3600.0)
CELERY_BEAT_SCHEDULE["shop.purge_mail"] = _beat_every("shop.purge_mail", SHOP_MAIL_PURGE_EVERY)
CELERY_BEAT_SCHEDULE["shop.purge_api_tokens"] = _beat_every(
    "shop.purge_api_tokens", API_TOKEN_PURGE_EVERY
)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="shop@example.com")
# Settlement's outcome confirms or fails the order, in the transaction that records it.
PAYMENTS_SETTLED_HANDLER = "orders.services.order_payment_settled"
# An order kept takes its cart version's lines out of the cart; one ended moves the cart on
# (docs/checkout.md, "One order per cart version"), in the transaction that decides it.
ORDERS_SCOPE_HANDLER = "shop.cart.cart_order_decided"

# --- Contract audit: /healthz in the OpenAPI document (a plain Django view) ----
SPECTACULAR_SETTINGS.setdefault("APPEND_PATHS", {})["/healthz"] = {
    "get": {
        "operationId": "healthz",
        "summary": "200 when the database and the broker answer, 503 otherwise, within 2 s.",
        "tags": ["operations"],
        "security": [{}],
        "responses": {
            "200": {"description": '{"status": "ok", "checks": {"database", "broker"}}'},
            "503": {"description": "application/problem+json: a dependency is not answering"},
        },
    }
}
SPECTACULAR_SETTINGS["APPEND_PATHS"]["/livez"] = {
    "get": {
        "operationId": "livez",
        "summary": "200 while the process can answer (no dependency checked).",
        "tags": ["operations"],
        "security": [{}],
        "responses": {"200": {"description": '{"status": "ok"}'}},
    }
}
SPECTACULAR_SETTINGS["APPEND_PATHS"]["/metrics"] = {
    "get": {
        "operationId": "metrics",
        "summary": "Prometheus text (names prefixed shop_); loopback and staff only.",
        "tags": ["operations"],
        "responses": {
            "200": {"description": "text/plain Prometheus exposition (docs/operations.md)"},
            "403": {"description": "application/problem+json: neither loopback nor staff"},
        },
    }
}

# --- Error reporting (optional): Sentry's Django and Celery integrations when
# SENTRY_DSN is set, personal data off (docs/operations.md, "Error reporting").
SENTRY_DSN = env.str("SENTRY_DSN", default="")
if SENTRY_DSN:
    from backoffice.error_reporting import error_reporting_init

    error_reporting_init(
        dsn=SENTRY_DSN,
        environment=env.str("SENTRY_ENVIRONMENT", default="production"),
        release=SHOP_VERSION,
    )
