"""What production settings refuse to start without (config/settings/production.py).

Its own module, importable without loading any settings, so that tools and
tests can name the list without tripping the check.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

REQUIRED = ("DATABASE_URL", "REDIS_URL", "ALLOWED_HOSTS", "SECRET_KEY", "PAYMENTS_WEBHOOK_SECRET")


def missing_required(environ: Mapping[str, str] = os.environ) -> list[str]:
    """Return the required variables that are unset or empty, in `REQUIRED`'s order."""
    return [name for name in REQUIRED if not environ.get(name, "").strip()]
