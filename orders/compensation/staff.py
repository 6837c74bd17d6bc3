"""Staff's actions on compensation steps: retry the failed ones.

Each locks the compensation's parent row (the return, or the cancelled
order) like the run's own transitions (`orders.compensation.state`).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from core import due

from ..models import CompensationStep, OrderEvent, ReturnRequest
from ..states import CompensationKind, ReturnStatus, StepStatus
from .state import lock_parent, step_event

# Steps "Retry failed steps" offers: failed, and any flagged one (a row flagged
# before its status moved, by the two-transaction flag of earlier versions).
NEEDS_STAFF = Q(status=StepStatus.FAILED) | Q(needs_attention=True)


def steps_retry_failed(*, step_ids: Iterable, by=None) -> int:
    """Staff: give each failed step a fresh budget, due now (core.due.retry_now); return how many.

    Failed means `failed` or flagged (`NEEDS_STAFF`: a step flagged while its
    status stayed `running`, left by earlier versions, gets out too). Its
    return goes back from `needs_attention` to `processing`. Safe to
    double-click: a step already retried is no longer failed.
    """
    retried = 0
    for step in CompensationStep.objects.filter(id__in=list(step_ids)).order_by("id"):
        with transaction.atomic():
            parent = lock_parent(step)
            source = (
                CompensationStep.objects.filter(NEEDS_STAFF, id=step.id, done_at__isnull=True)
                .values_list("status", flat=True)
                .first()
            )
            if source is None:
                continue
            if not due.retry_now(CompensationStep, pk=step.id):
                continue
            CompensationStep.objects.filter(id=step.id).update(status=StepStatus.PENDING)
            retried += 1
            step_event(
                step=step,
                kind="compensation_retry",
                source=source,
                target=StepStatus.PENDING,
                by=getattr(by, "username", None),
            )
            if isinstance(parent, ReturnRequest) and ReturnRequest.objects.filter(
                id=parent.id, status=ReturnStatus.NEEDS_ATTENTION
            ).update(status=ReturnStatus.PROCESSING, updated_at=Now()):
                OrderEvent.objects.create(
                    order_id=step.order_id,
                    kind="return_retry",
                    from_status=ReturnStatus.NEEDS_ATTENTION,
                    to_status=ReturnStatus.PROCESSING,
                    data={"return_id": str(parent.id), "by": getattr(by, "username", None)},
                )
    return retried


def return_retry_failed_steps(*, return_id, by=None) -> int:
    ids = CompensationStep.objects.filter(
        NEEDS_STAFF, order_return_id=return_id, done_at__isnull=True
    ).values_list("id", flat=True)
    return steps_retry_failed(step_ids=ids, by=by)


def cancellation_retry_failed_steps(*, order_id, by=None) -> int:
    ids = CompensationStep.objects.filter(
        NEEDS_STAFF, order_id=order_id, kind=CompensationKind.CANCELLATION, done_at__isnull=True
    ).values_list("id", flat=True)
    return steps_retry_failed(step_ids=ids, by=by)
