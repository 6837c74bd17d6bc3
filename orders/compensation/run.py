"""Compensation: undoing a confirmed order's effects by new, forward steps (docs/compensation.md).

A received return or a cancelled confirmed order gets one `CompensationStep`
row per step — `restock`, `refund`, `history`, `loyalty`, `notify` — in the
transaction that started it (`steps_insert`). Each row is due work
(`core.due`): rung after commit (`orders.compensation_step` by id; a step
that waits for another is rung by that step's done instead), re-rung
by beat's sweeper (`orders.sweep_compensation`), one attempt at a time
(`due.attempt_begin`), backing off on failure, `needs_attention` after the
budget. `step_run` is the task's whole body.

Each step is idempotent on its own, and its done transition is the one
place that records it:

    restock   on_hand += units (F()) in the transaction that marks it done
              (exactly once: both commit or neither)
    refund    payments.refunds.refund_request under a refund id DERIVED
              from the return / cancellation (uuid5): asking again is the same
              refund; done when that refund succeeded; a refund that needs
              attention (or is refused) fails the step → needs attention
    history,  the ONE outbox event (`return.completed` / `order.cancelled`),
    loyalty   written in the done transaction of whichever of the two comes
              first; the consumers dedupe by outbox id. Done when written.
    notify    an e-mail through Django's email backend, then done: at least
              once (a crash between the two sends it again)

Every done transition locks the compensation's parent row first (the return,
or the cancelled order), so the last step to finish sees every other one
done and completes the parent (conditional UPDATE, once) with its event.
`after` makes a step wait for another (history, loyalty and notify wait for
the refund: points and history are reversed once the money is back).

One module per job: this one starts a compensation (`steps_insert`) and runs
its attempts (`step_run`, `steps_sweep`); `orders.compensation.state` holds
the step row's shared transitions (done, waiting, needs attention);
`orders.compensation.steps` the restock, event and e-mail steps;
`orders.compensation.refund` the refund step; `orders.compensation.staff`
staff's actions (retry failed steps, stop a step for staff). The package's
`__init__` names what other modules use.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models.functions import Now

from core import due
from idempotency.failpoints import failpoint

from ..models import CompensationStep
from ..states import StepName, StepStatus
from .refund import refund_step
from .state import (
    StepNeedsAttention,
    attention_effects,
    lock_parent,
    siblings,
    step_attention,
    step_wait,
)
from .steps import notify, publish_once, restock

logger = logging.getLogger(__name__)


# (name, the step it waits for). Restock and refund are independent; the event
# steps and the e-mail wait for the refund (points reverse once the money is back).
PLAN: tuple[tuple[str, str], ...] = (
    (StepName.RESTOCK, ""),
    (StepName.REFUND, ""),
    (StepName.HISTORY, StepName.REFUND),
    (StepName.LOYALTY, StepName.REFUND),
    (StepName.NOTIFY, StepName.REFUND),
)


# -- starting ----------------------------------------------------------------------------


def steps_insert(*, order_id, kind: str, order_return_id=None) -> list[int]:
    """Insert one compensation's step rows (inside the transaction that started it); ring
    the steps that wait for none.

    A step that waits for another starts waiting: due only after
    COMPENSATION_AFTER_RECHECK (the sweeper's safety net), and the step before's
    done transaction (`finishing`) makes it due now and rings it. No transaction
    can finish that step before this one commits, so no wake-up is lost. Rung at
    once, each would only have looked, found the refund not done and waited:
    three of a compensation's five first tasks.

    The unique constraints (return, name) / (cancelled order, name) make a
    second set an IntegrityError: a programming error, since only the one
    conditional UPDATE that started the compensation calls this.
    """
    assert connection.in_atomic_block, "steps are inserted with the transition that starts them"
    waiting = Now() + timedelta(seconds=settings.COMPENSATION_AFTER_RECHECK)
    rows = CompensationStep.objects.bulk_create(
        CompensationStep(
            kind=kind,
            order_id=order_id,
            order_return_id=order_return_id,
            name=name,
            position=position,
            after=after,
            status=StepStatus.PENDING,
            # No note yet: the API shows a step nobody has looked at (last_error null).
            **({"next_attempt_at": waiting} if after else {}),
        )
        for position, (name, after) in enumerate(PLAN)
    )
    due.ring_many_after_commit(CompensationStep, [row.id for row in rows if not row.after])
    return [row.id for row in rows]


# -- one attempt (the task's body) ---------------------------------------------------------


def _db_seconds_until(step_id) -> float:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT GREATEST(0, EXTRACT(EPOCH FROM next_attempt_at - now()))"
            f" FROM {CompensationStep._meta.db_table} WHERE id = %s",
            [step_id],
        )
        row = cursor.fetchone()
    return float(row[0]) if row else 0.0


def _attempt_failed(*, step: CompensationStep, attempt: due.Attempt, error: str) -> due.Ended:
    """A transient failure: recorded, and at the budget flagged and `failed` with its events,
    in ONE transaction (a worker killed in it leaves the attempt as begun, due again)."""
    with transaction.atomic():
        parent = lock_parent(step)
        ended = due.attempt_failed(
            CompensationStep,
            pk=step.id,
            error=error,
            attempt=attempt,
            attention_values={"status": StepStatus.FAILED, "updated_at": Now()},
            retry_values={"status": StepStatus.PENDING, "updated_at": Now()},
        )
        if ended is due.Ended.ATTENTION:
            attention_effects(step=step, parent=parent, reason=error)
    return ended


def step_run(*, step_id) -> str:
    """Make one attempt at a compensation step if it is due; return what happened (for logs).

    Must be called with no transaction open (the refund and the e-mail call
    out). `due.attempt_begin` lets one runner take the attempt and pushes the
    next one back before any work, so a runner killed anywhere leaves the row
    due later for the sweeper.
    """
    assert not connection.in_atomic_block, "step_run calls out: no transaction may be open"
    attempt = due.attempt_begin(CompensationStep, pk=step_id, values={"status": StepStatus.RUNNING})
    step = CompensationStep.objects.filter(id=step_id).first()
    if step is None:
        return "no such step"
    if attempt.budget_spent:
        budget = CompensationStep.due_policy().max_attempts
        step_attention(step=step, reason=f"attempt budget spent ({budget} attempts)", flag=True)
        return "needs attention"
    if not attempt.taken:
        return "not due"
    step.status = StepStatus.RUNNING  # in attempt_begin's UPDATE
    return _attempt_run(step=step, attempt=attempt)


def _attempt_run(*, step: CompensationStep, attempt: due.Attempt) -> str:
    step_id = step.id
    if step.after:
        held = _held_by_the_step_before(step, attempt)
        if held is not None:
            return held
    try:
        failpoint(f"compensation.{step.name}.before_effect")
        outcome = _HANDLERS[step.name](step, attempt)
    except StepNeedsAttention as exc:
        if not step_attention(step=step, reason=str(exc), attempt=attempt):
            return "stale"
        return "needs attention"
    except Exception as exc:  # noqa: BLE001 - any other failure is transient: back off, retry
        logger.warning("compensation step %s (%s) failed: %s", step_id, step.name, exc)
        ended = _attempt_failed(step=step, attempt=attempt, error=f"{type(exc).__name__}: {exc}")
        if ended is due.Ended.REFUSED:
            return "stale"  # another attempt holds the step (or staff): it decides
        if ended is due.Ended.ATTENTION:
            logger.error("compensation step %s (%s) needs attention: %s", step_id, step.name, exc)
            return "needs attention"
        due.ring(CompensationStep, step_id, delay=_db_seconds_until(step_id) + 0.05)
        return "failed"
    return outcome


def _held_by_the_step_before(step: CompensationStep, attempt: due.Attempt) -> str | None:
    """The step it follows is not done: give the attempt back and say why; None: go on.

    No polling either way: that step's done transaction (`finishing`) makes
    this one due now and rings it, so the re-check is only a safety net the
    sweeper finds (COMPENSATION_AFTER_RECHECK while that step is on its way,
    COMPENSATION_PARKED_RECHECK while it needs staff). A waiting step that
    polled would fill the workers with looks that find the step before not
    done (docs/compensation.md, "Order of the steps").

    The look and the wait happen under the parent's lock, which
    `finishing` takes before it marks a step done and makes its dependents
    due: either the step before is seen done here, or its done transaction
    comes after this wait has committed and makes this step due again. Read
    without the lock, a done transaction committing in between made this
    step due now and then this wait pushed it back: a lost wake-up.
    """
    with transaction.atomic():
        lock_parent(step)
        before = siblings(step).filter(name=step.after).values("done_at", "needs_attention")[0]
        if before["done_at"] is not None:
            return None
        if before["needs_attention"]:
            outcome, seconds = "parked", settings.COMPENSATION_PARKED_RECHECK
            note = f"parked: {step.after} needs attention"
        else:
            outcome, seconds = "waiting", settings.COMPENSATION_AFTER_RECHECK
            note = f"waiting for {step.after}"
        waited = step_wait(step_id=step.id, attempt=attempt, seconds=seconds, note=note, ring=False)
        return outcome if waited else "stale"


# Keyed by the step's name as stored (a plain str, equal to its StepName). Each handler
# gets the step and the attempt `step_run` took; its writes of the step are fenced on it.
_HANDLERS: dict[str, Callable[[CompensationStep, due.Attempt], str]] = {
    StepName.RESTOCK: restock,
    StepName.REFUND: refund_step,
    StepName.HISTORY: publish_once,
    StepName.LOYALTY: publish_once,
    StepName.NOTIFY: notify,
}


def steps_sweep(*, limit: int) -> int:
    """Beat: enqueue every due step (core.due.sweep)."""
    return len(due.sweep(CompensationStep, limit=limit))
