"""Beat's clean-ups of what core keeps: ended sessions, expired API tokens.

docs/operations.md, "Retention". Each deletes in bounded batches that skip
rows another run holds, so two beats at once delete each row once.
"""

from __future__ import annotations

from importlib import import_module

from celery import shared_task
from django.conf import settings

from . import authentication


@shared_task(bind=True, name="core.clear_expired_sessions", max_retries=0)
def clear_expired_sessions(self) -> int:
    """Delete ended sessions (the session engine's `clear_expired`, database clock)."""
    return import_module(settings.SESSION_ENGINE).SessionStore.clear_expired()


@shared_task(bind=True, name="core.purge_expired_tokens", max_retries=0)
def purge_expired_tokens(self) -> int:
    """Delete API tokens past API_TOKEN_LIFETIME (database clock)."""
    return authentication.tokens_purge_expired()
