"""Judge lease ages by the database clock (`now()`), never the process's."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import DateTimeField, ExpressionWrapper, Q, Value
from django.db.models.functions import Now


def _db_ago(seconds: float) -> ExpressionWrapper:
    """`now() - seconds`, computed by the database."""
    return ExpressionWrapper(
        Now() - Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


def _lease_ttl() -> float:
    return float(settings.IDEMPOTENCY_LEASE_TTL)


def _claim_lock_timeout() -> str:
    """The claim's `lock_timeout` (IDEMPOTENCY_CLAIM_WAIT); at least 1 ms (0 would mean none)."""
    return f"{max(1, round(float(settings.IDEMPOTENCY_CLAIM_WAIT) * 1000))}ms"


def _lease_free_or_expired() -> Q:
    return Q(leased_by__isnull=True) | Q(leased_at__lt=_db_ago(_lease_ttl()))
