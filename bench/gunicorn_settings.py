"""The bench's gunicorn settings: the test support's plus the peer (drf-idempotencykey).

`tests.support.bench_settings` (production's base settings, the probe and
the unkeyed checkout) plus the bench-only peer checkout of bench/peer.py and
its app `drf_idempotencykey` (a bench-only dependency: requirements/bench.txt).
With SHOP_FAILPOINTS set, the middleware that can crash a worker between
the commit and the answer goes last (closest to the view).
"""

import os

from tests.support.bench_settings import *  # noqa: F401,F403
from tests.support.bench_settings import INSTALLED_APPS, MIDDLEWARE

INSTALLED_APPS = [*INSTALLED_APPS, "drf_idempotencykey"]
ROOT_URLCONF = "bench.urls"
if os.environ.get("SHOP_FAILPOINTS"):
    MIDDLEWARE = [*MIDDLEWARE, "bench.peer.CrashBeforeAnswer"]
# The peer's defaults, stated: keys expire after 60 minutes; only 2xx answers are stored.
IDEMPOTENCY_KEY_EXPIRATION_MINUTES = 60
