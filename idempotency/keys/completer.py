"""Drive keys abandoned mid-way to their end: the completer."""

from __future__ import annotations

import logging
import time

from django.conf import settings

from ..models import FINISHED, IdempotencyKey
from .claim import _key_take_over
from .clock import _db_ago, _lease_free_or_expired
from .operations import registered_operations

logger = logging.getLogger(__name__)


def keys_complete_abandoned(*, limit: int | None = None, budget: float | None = None) -> int:
    """Finish, roll back or re-open keys abandoned mid-way; return how many were completed.

    Abandoned = not finished, lease free or expired, and `last_run_at` older than
    IDEMPOTENCY_ABANDON_AFTER (database clock). Each is taken over with a fresh
    fencing token, so a client retry and the completer never both run it.

    No key is started once `budget` seconds (IDEMPOTENCY_COMPLETER_BUDGET) have
    passed since the run began: each key may make a provider call, and a run
    must end well inside the broker's visibility timeout (docs/celery.md).
    The keys left over are the next run's.
    """
    operations = registered_operations()
    if not operations:
        return 0
    limit = limit or int(settings.IDEMPOTENCY_COMPLETER_BATCH)
    budget = float(settings.IDEMPOTENCY_COMPLETER_BUDGET if budget is None else budget)
    deadline = time.monotonic() + budget
    key_ids = list(
        IdempotencyKey.objects.exclude(recovery_point=FINISHED)
        .filter(operation__in=list(operations))
        .filter(_lease_free_or_expired())
        .filter(last_run_at__lt=_db_ago(float(settings.IDEMPOTENCY_ABANDON_AFTER)))
        .order_by("last_run_at")
        .values_list("pk", flat=True)[:limit]
    )
    settled = 0
    for index, key_id in enumerate(key_ids):
        if time.monotonic() >= deadline:
            logger.info(
                "completer budget spent; %d keys left to the next run", len(key_ids) - index
            )
            break
        run = _key_take_over(key_id=key_id, abandoned=True)
        if run is None:
            continue
        try:
            operations[run.operation].complete(run)
        except Exception:
            logger.exception("completer could not complete %r; it will try again", run)
            run.drop_lease_quietly()
            continue
        if not run.closed:
            run.drop_lease_quietly()
        settled += 1
        logger.info("completer completed %r", run)
    return settled
