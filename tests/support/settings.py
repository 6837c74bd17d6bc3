"""What a settings module adds to install the test support (the test settings and the bench's)."""

import environ

env = environ.Env()

TEST_SUPPORT_APPS = ["tests.support"]
ROOT_URLCONF = "tests.support.urls"
# The probe's outside call (tests/support/probe.py); unset, it calls nothing.
SHOP_PROBE_STUB_URL = env.str("SHOP_PROBE_STUB_URL", default="")
SHOP_PROBE_STUB_TIMEOUT = env.float("SHOP_PROBE_STUB_TIMEOUT", default=5.0)
