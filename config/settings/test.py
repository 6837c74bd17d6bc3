"""Settings for the test suite: the same servers as production, never SQLite."""

import os

from .base import *  # noqa: F401,F403
from .base import CACHES, CELERY_TASK_ROUTES, INSTALLED_APPS, REST_FRAMEWORK

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Each test run gets its own cache namespace so parallel runs on one Redis do
# not share throttle counters.
CACHES["default"]["KEY_PREFIX"] = f"shoptest-{os.getpid()}"
REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] = {
    **REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"],
    "auth_token": os.environ.get("SHOP_TOKEN_THROTTLE_RATE", "5/min"),
}
# The suite's fixtures, the money model and the race tests place many orders per
# shopper; tests of the limits themselves set them low (tests/orders/test_order_limits.py).
ORDER_PLACE_PER_MINUTE = 100_000
ORDER_HOLDING_MAX = 100_000
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
# A fixed webhook secret: the test simulator and signed test events use the same one.
PAYMENTS_WEBHOOK_SECRET = "whsec_test_0123456789abcdef"
# No collectstatic in tests: serve from finders and skip scanning STATIC_ROOT.
WHITENOISE_AUTOREFRESH = True
WHITENOISE_USE_FINDERS = True

# --- Test support: the probe, the unkeyed twin (never installed in production) ---
from tests.support.settings import *  # noqa: E402,F401,F403
from tests.support.settings import TEST_SUPPORT_APPS  # noqa: E402

INSTALLED_APPS = [*INSTALLED_APPS, *TEST_SUPPORT_APPS]
# The test-only due-work kind's task (tests/support/tasks.py) runs beside the sweeps.
CELERY_TASK_ROUTES = {
    **CELERY_TASK_ROUTES,
    "testsupport.work_chore": {"queue": "maintenance"},
    "testsupport.linger": {"queue": "maintenance"},
}

# The relay/consumer tests count two consumers; tests/shop/test_emails.py calls the e-mail one.
SHOP_EMAILS = False
