"""Beat's clean-up of what core keeps: ended sessions (API tokens: shop.purge_api_tokens).

docs/operations.md, "Retention". Each deletes in bounded batches that skip
rows another run holds, so two beats at once delete each row once.
"""

from __future__ import annotations

from importlib import import_module

from celery import shared_task
from django.conf import settings


@shared_task(bind=True, name="core.clear_expired_sessions", max_retries=0)
def clear_expired_sessions(self) -> int:
    """Delete ended sessions (the session engine's `clear_expired`, database clock)."""
    return import_module(settings.SESSION_ENGINE).SessionStore.clear_expired()
