"""A compensation step row's shared transitions: done, waiting, needs attention.

Used by the run (`orders.compensation.run`), the steps
(`orders.compensation.steps`, `orders.compensation.refund`) and staff's
actions (`orders.compensation.staff`). Every one locks the compensation's
parent row first (the return, or the cancelled order): the last step to be
done sees every other one done and completes the parent (conditional UPDATE,
once) with its event (`finishing`).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from datetime import timedelta

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Greatest, Now

from core import due
from core.money import format_money
from idempotency.failpoints import failpoint

from .. import lock_objects
from ..models import CompensationStep, Order, OrderEvent, ReturnRequest
from ..states import CompensationKind, OrderStatus, ReturnStatus, StepName, StepStatus
from ..transitions import order_cancel_complete

# The run's logger: its needs-attention lines keep their name wherever they are written.
logger = logging.getLogger("orders.compensation")


class StepNeedsAttention(Exception):
    """A step met something retrying will not fix (a refused or flagged refund): staff decide."""


def step_event(*, step: CompensationStep, kind: str, source: str, target: str, **data) -> None:
    OrderEvent.objects.create(
        order_id=step.order_id,
        kind=kind,
        from_status=source,
        to_status=target,
        data={
            "step": step.name,
            "compensation": step.kind,
            **({"return_id": str(step.order_return_id)} if step.order_return_id else {}),
            **data,
        },
    )


def step_wait(
    *, step_id, attempt: due.Attempt, seconds: float, note: str, ring: bool = True
) -> bool:
    """Not an attempt: give `attempt` back and look again in `seconds` (database clock).

    Fenced on the attempt's token: a stale runner (its lease ran out, another
    attempt flagged or finished the step) sets nothing back to pending and
    rings nothing; return False then. Without `ring` nothing is enqueued: the
    sweeper finds the row when it is due.
    """
    rows = CompensationStep.objects.filter(id=step_id, done_at__isnull=True, needs_attention=False)
    moved = due.fence(rows, attempt)
    if not moved.update(
        attempts=Greatest(F("attempts") - 1, 0),
        next_attempt_at=Now() + timedelta(seconds=seconds),
        status=StepStatus.PENDING,
        last_error=due.truncate_error(note),
        lease_owner="",
        lease_expires_at=None,
        updated_at=Now(),
    ):
        return False
    if ring:
        due.ring(CompensationStep, step_id, delay=seconds)
    return True


def lock_parent(step: CompensationStep):
    """Lock the compensation's parent row: the return; or the cancelled order, after its payment.

    A cancellation's transitions take the payment's row lock first (the lock
    order: the payment, then the order), so the transaction that writes
    `cancelled` reads what the payment refunded under the lock every refund
    request takes (`_cancellation_complete`).
    """
    if step.order_return_id is not None:
        return ReturnRequest.objects.select_for_update().get(id=step.order_return_id)
    return lock_objects.order_and_payment_lock(order_id=step.order_id)


def siblings(step: CompensationStep):
    if step.order_return_id is not None:
        return CompensationStep.objects.filter(order_return_id=step.order_return_id)
    return CompensationStep.objects.filter(
        order_id=step.order_id, kind=CompensationKind.CANCELLATION
    )


def _complete_if_all_done(step: CompensationStep, parent) -> bool:
    """With the parent locked: every step done → the parent completes (once) with its event."""
    if siblings(step).filter(done_at__isnull=True).exists():
        return False
    if step.order_return_id is not None:
        moved = ReturnRequest.objects.filter(
            id=step.order_return_id,
            status__in=[ReturnStatus.PROCESSING, ReturnStatus.NEEDS_ATTENTION],
        ).update(status=ReturnStatus.COMPLETED, completed_at=Now(), updated_at=Now())
        if moved:
            OrderEvent.objects.create(
                order_id=step.order_id,
                kind="return_completed",
                from_status=ReturnStatus.PROCESSING,
                to_status=ReturnStatus.COMPLETED,
                data={"return_id": str(step.order_return_id)},
            )
        return bool(moved)
    return _cancellation_complete(step, parent)


def _cancellation_complete(step: CompensationStep, parent: Order) -> bool:
    """Every step done: `cancelling` → `cancelled` only when the payment refunded all it captured.

    Checked in the transaction that writes `cancelled`, under the payment's
    row lock (`lock_parent`), by the transition's own conditional UPDATE
    (`order_cancel_complete`). The refund step is done only when that holds
    (`orders.compensation.refund`), so this finds it so; if it ever does
    not, the refund step is reopened — pending, a fresh budget, due now,
    rung, with a `compensation_reopened` event — and asks for the rest; its
    done transaction completes the order then. Never a dead end.
    """
    if order_cancel_complete(order_id=step.order_id):
        return True
    payment = parent.payment if parent.payment_id is not None else None
    if (
        parent.status != OrderStatus.CANCELLING
        or payment is None
        or payment.amount_refunded == payment.amount_captured
    ):
        return False  # cancelled already (another transition won), or nothing owed
    refund_step = siblings(step).filter(name=StepName.REFUND, done_at__isnull=False).first()
    if refund_step is None:
        return False  # the refund step is on its way: its done transaction checks again
    note = (
        f"refunded {format_money(payment.amount_refunded, payment.currency)} of "
        f"{format_money(payment.amount_captured, payment.currency)} captured: asking for the rest"
    )
    CompensationStep.objects.filter(id=refund_step.id, done_at__isnull=False).update(
        status=StepStatus.PENDING, done_at=None, last_error=note, updated_at=Now()
    )
    due.retry_now(CompensationStep, pk=refund_step.id)
    step_event(
        step=refund_step,
        kind="compensation_reopened",
        source=StepStatus.DONE,
        target=StepStatus.PENDING,
        refunded=format_money(payment.amount_refunded, payment.currency),
        captured=format_money(payment.amount_captured, payment.currency),
    )
    logger.error("cancellation of order %s: %s", step.order_id, note)
    return False


@contextmanager
def finishing(step: CompensationStep):
    """The step's done transaction: parent locked, done transition first; yields True if won.

    The step's transactional effect runs inside the block only when it won,
    so effect and done commit together (or, killed, neither). Then the
    failpoint `compensation.<step>.after_effect` (the effect made, nothing
    committed yet), the parent's completion, and the dependents' bells.
    """
    with transaction.atomic():
        parent = lock_parent(step)
        won = bool(
            CompensationStep.objects.filter(id=step.id, done_at__isnull=True).update(
                status=StepStatus.DONE,
                done_at=Now(),
                needs_attention=False,
                last_error="",
                lease_owner="",
                lease_expires_at=None,
                updated_at=Now(),
            )
        )
        yield won
        if not won:
            return
        if step.name != StepName.REFUND and step.name != StepName.NOTIFY:
            failpoint(f"compensation.{step.name}.after_effect")
        step_event(step=step, kind="compensation_step", source=step.status, target=StepStatus.DONE)
        dependents = list(
            siblings(step)
            .filter(after=step.name, done_at__isnull=True, needs_attention=False)
            .values_list("id", flat=True)
        )
        if dependents:
            CompensationStep.objects.filter(id__in=dependents).update(next_attempt_at=Now())
            due.ring_many_after_commit(CompensationStep, dependents)
        _complete_if_all_done(step, parent)


def step_attention(
    *, step: CompensationStep, reason: str, flag: bool = True, attempt: due.Attempt | None = None
) -> bool:
    """The step stops for staff: flagged and `failed` in one UPDATE, its return
    `needs_attention`, with the events, all in one transaction; return True if this call did it.

    With `attempt`, only while that attempt still holds the step (a stale
    runner changes nothing). `flag=False`: the caller flagged it already.
    """
    with transaction.atomic():
        parent = lock_parent(step)
        if flag:
            moved = due.flag_attention(
                CompensationStep,
                pk=step.id,
                reason=reason,
                attempt=attempt,
                values={"status": StepStatus.FAILED},
            )
        else:
            moved = bool(
                CompensationStep.objects.filter(
                    id=step.id, done_at__isnull=True, needs_attention=True
                )
                .exclude(status=StepStatus.FAILED)
                .update(status=StepStatus.FAILED, updated_at=Now())
            )
        if not moved:
            return False
        attention_effects(step=step, parent=parent, reason=reason)
    logger.error("compensation step %s (%s) needs attention: %s", step.id, step.name, reason)
    return True


def attention_effects(*, step: CompensationStep, parent, reason: str) -> None:
    """Events of a step that became `failed`; its return `needs_attention` (parent locked)."""
    step_event(
        step=step,
        kind="compensation_step",
        source=step.status,
        target=StepStatus.FAILED,
        reason=due.truncate_error(reason),
    )
    if isinstance(parent, ReturnRequest):
        if ReturnRequest.objects.filter(id=parent.id, status=ReturnStatus.PROCESSING).update(
            status=ReturnStatus.NEEDS_ATTENTION, updated_at=Now()
        ):
            OrderEvent.objects.create(
                order_id=step.order_id,
                kind="return_needs_attention",
                from_status=ReturnStatus.PROCESSING,
                to_status=ReturnStatus.NEEDS_ATTENTION,
                data={"return_id": str(parent.id), "step": step.name},
            )
