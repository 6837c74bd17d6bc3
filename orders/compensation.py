"""Compensation: undoing a confirmed order's effects by new, forward steps (docs/compensation.md).

A received return or a cancelled confirmed order gets one `CompensationStep`
row per step — `restock`, `refund`, `history`, `loyalty`, `notify` — in the
transaction that started it (`steps_insert`). Each row is due work
(`core.due`): rung after commit (`orders.compensation_step` by id), re-rung
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
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.core.mail import send_mail
from django.db import connection, transaction
from django.db.models import F, Q, Sum
from django.db.models.functions import Greatest, Now

from core import due
from core.errors import ApplicationError
from core.money import format_money
from idempotency.failpoints import failpoint
from idempotency.outbox import outbox_write
from inventory import services as inventory_services
from payments import refunds as payment_refunds
from payments.models import Payment, Refund, RefundOrigin, RefundStatus

from . import lock_objects
from .models import (
    CompensationStep,
    Order,
    OrderEvent,
    OrderLine,
    ReturnLine,
    ReturnRequest,
)
from .states import (
    CompensationKind,
    LineStatus,
    ReturnStatus,
    StepName,
    StepStatus,
)
from .transitions import order_cancel_complete, order_event_payload

logger = logging.getLogger(__name__)

# Refund ids of compensation are derived from what they compensate, never random:
# uuid5(NAMESPACE, "return:<return id>") and uuid5(NAMESPACE, "cancel:<order id>").
NAMESPACE = uuid.UUID("6f1f3c2e-8a4b-5d7e-9c10-2b3a4d5e6f70")

# (name, the step it waits for). Restock and refund are independent; the event
# steps and the e-mail wait for the refund (points reverse once the money is back).
PLAN: tuple[tuple[str, str], ...] = (
    (StepName.RESTOCK, ""),
    (StepName.REFUND, ""),
    (StepName.HISTORY, StepName.REFUND),
    (StepName.LOYALTY, StepName.REFUND),
    (StepName.NOTIFY, StepName.REFUND),
)
EVENT_STEPS = frozenset({StepName.HISTORY, StepName.LOYALTY})


def return_refund_id(return_id) -> uuid.UUID:
    return uuid.uuid5(NAMESPACE, f"return:{return_id}")


def cancellation_refund_id(order_id) -> uuid.UUID:
    return uuid.uuid5(NAMESPACE, f"cancel:{order_id}")


# The attempt `step_run` is making, so that the handlers' writes of it (`_wait`) are
# fenced on its token without every handler passing it along.
_current_attempt: ContextVar[due.Attempt | None] = ContextVar("compensation_attempt", default=None)

# Steps "Retry failed steps" offers: failed, and any flagged one (a row flagged
# before its status moved, by the two-transaction flag of earlier versions).
NEEDS_STAFF = Q(status=StepStatus.FAILED) | Q(needs_attention=True)


class StepNeedsAttention(Exception):
    """A step met something retrying will not fix (a refused or flagged refund): staff decide."""


def _event(*, step: CompensationStep, kind: str, source: str, target: str, **data) -> None:
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


# -- starting ----------------------------------------------------------------------------


def steps_insert(*, order_id, kind: str, order_return_id=None) -> list[int]:
    """Insert one compensation's step rows (inside the transaction that started it); ring them.

    The unique constraints (return, name) / (cancelled order, name) make a
    second set an IntegrityError: a programming error, since only the one
    conditional UPDATE that started the compensation calls this.
    """
    assert connection.in_atomic_block, "steps are inserted with the transition that starts them"
    rows = CompensationStep.objects.bulk_create(
        CompensationStep(
            kind=kind,
            order_id=order_id,
            order_return_id=order_return_id,
            name=name,
            position=position,
            after=after,
            status=StepStatus.PENDING,
        )
        for position, (name, after) in enumerate(PLAN)
    )
    ids = [row.id for row in rows]
    due.ring_many_after_commit(CompensationStep, ids)
    return ids


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


def _wait(*, step_id, seconds: float, note: str, ring: bool = True) -> bool:
    """Not an attempt: give the attempt back and look again in `seconds` (database clock).

    Fenced on the running attempt's token (`_current_attempt`): a stale runner
    (its lease ran out, another attempt flagged or finished the step) sets
    nothing back to pending and rings nothing; return False then. Without
    `ring` nothing is enqueued: the sweeper finds the row when it is due.
    """
    rows = CompensationStep.objects.filter(id=step_id, done_at__isnull=True, needs_attention=False)
    attempt = _current_attempt.get()
    moved = due.fence(rows, attempt if attempt is not None and attempt.pk == step_id else None)
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


def _lock_parent(step: CompensationStep):
    """Lock the compensation's parent row: the return, or the cancelled order."""
    if step.order_return_id is not None:
        return ReturnRequest.objects.select_for_update().get(id=step.order_return_id)
    return lock_objects.order_lock(order_id=step.order_id)


def _siblings(step: CompensationStep):
    if step.order_return_id is not None:
        return CompensationStep.objects.filter(order_return_id=step.order_return_id)
    return CompensationStep.objects.filter(
        order_id=step.order_id, kind=CompensationKind.CANCELLATION
    )


def _complete_if_all_done(step: CompensationStep) -> bool:
    """With the parent locked: every step done → the parent completes (once) with its event."""
    if _siblings(step).filter(done_at__isnull=True).exists():
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
    return order_cancel_complete(order_id=step.order_id)


@contextmanager
def _finishing(step: CompensationStep):
    """The step's done transaction: parent locked, done transition first; yields True if won.

    The step's transactional effect runs inside the block only when it won,
    so effect and done commit together (or, killed, neither). Then the
    failpoint `compensation.<step>.after_effect` (the effect made, nothing
    committed yet), the parent's completion, and the dependents' bells.
    """
    with transaction.atomic():
        _lock_parent(step)
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
        _event(step=step, kind="compensation_step", source=step.status, target=StepStatus.DONE)
        dependents = list(
            _siblings(step)
            .filter(after=step.name, done_at__isnull=True, needs_attention=False)
            .values_list("id", flat=True)
        )
        if dependents:
            CompensationStep.objects.filter(id__in=dependents).update(next_attempt_at=Now())
            due.ring_many_after_commit(CompensationStep, dependents)
        _complete_if_all_done(step)


def _attention(
    *, step: CompensationStep, reason: str, flag: bool = True, attempt: due.Attempt | None = None
) -> bool:
    """The step stops for staff: flagged and `failed` in one UPDATE, its return
    `needs_attention`, with the events, all in one transaction; return True if this call did it.

    With `attempt`, only while that attempt still holds the step (a stale
    runner changes nothing). `flag=False`: the caller flagged it already.
    """
    with transaction.atomic():
        parent = _lock_parent(step)
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
        _attention_effects(step=step, parent=parent, reason=reason)
    logger.error("compensation step %s (%s) needs attention: %s", step.id, step.name, reason)
    return True


def _attention_effects(*, step: CompensationStep, parent, reason: str) -> None:
    """Events of a step that became `failed`; its return `needs_attention` (parent locked)."""
    _event(
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


def _attempt_failed(*, step: CompensationStep, attempt: due.Attempt, error: str) -> due.Ended:
    """A transient failure: recorded, and at the budget flagged and `failed` with its events,
    in ONE transaction (a worker killed in it leaves the attempt as begun, due again)."""
    with transaction.atomic():
        parent = _lock_parent(step)
        ended = due.attempt_failed(
            CompensationStep,
            pk=step.id,
            error=error,
            attempt=attempt,
            attention_values={"status": StepStatus.FAILED, "updated_at": Now()},
            retry_values={"status": StepStatus.PENDING, "updated_at": Now()},
        )
        if ended is due.Ended.ATTENTION:
            _attention_effects(step=step, parent=parent, reason=error)
    return ended


def step_flag_attention(*, step_id, reason: str) -> None:
    """Stop a pending step for staff, as a refusal would (`failed`, its return
    `needs_attention`); "Retry failed steps" takes it up again. For demo data and drills."""
    step = CompensationStep.objects.get(id=step_id)
    _attention(step=step, reason=reason, flag=True)


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
        _attention(step=step, reason=f"attempt budget spent ({budget} attempts)", flag=True)
        return "needs attention"
    if not attempt.taken:
        return "not due"
    step.status = StepStatus.RUNNING  # in attempt_begin's UPDATE
    token = _current_attempt.set(attempt)
    try:
        return _attempt_run(step=step, attempt=attempt)
    finally:
        _current_attempt.reset(token)


def _attempt_run(*, step: CompensationStep, attempt: due.Attempt) -> str:
    step_id = step.id
    if step.after:
        before = _siblings(step).filter(name=step.after).values("done_at", "needs_attention")[0]
        if before["done_at"] is None:
            if before["needs_attention"]:
                # Parked while the step it follows needs staff: no bell, no
                # polling (a message every backoff would loop until staff
                # act). That step's done transaction makes this one due now
                # and rings it (`_finishing`); the long re-check is only a
                # safety net, found by the sweeper.
                parked = _wait(
                    step_id=step_id,
                    seconds=settings.COMPENSATION_PARKED_RECHECK,
                    note=f"parked: {step.after} needs attention",
                    ring=False,
                )
                return "parked" if parked else "stale"
            waiting = _wait(
                step_id=step_id,
                seconds=settings.COMPENSATION_WAIT_SECONDS,
                note=f"waiting for {step.after}",
            )
            return "waiting" if waiting else "stale"
    try:
        failpoint(f"compensation.{step.name}.before_effect")
        outcome = _HANDLERS[step.name](step)
    except StepNeedsAttention as exc:
        if not _attention(step=step, reason=str(exc), attempt=attempt):
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


# -- the steps ---------------------------------------------------------------------------------


def _restock(step: CompensationStep) -> str:
    with _finishing(step) as won:
        if not won:
            return "already done"
        if step.order_return_id is not None:
            units: dict[uuid.UUID, int] = {}
            for product_id, quantity in ReturnRequest.objects.get(
                id=step.order_return_id
            ).lines.values_list("order_line__product_id", "quantity"):
                units[product_id] = units.get(product_id, 0) + quantity
        else:
            units = _cancel_lines(step)
        if units:
            inventory_services.stock_restock(units=units)
        CompensationStep.objects.filter(id=step.id).update(
            detail={"units": {str(k): v for k, v in units.items()}}
        )
    return "done"


def _cancel_lines(step: CompensationStep) -> dict[uuid.UUID, int]:
    """The cancelled order's confirmed lines → `cancelled` (with events); their units by product."""
    lines = lock_objects.order_lines_lock(order_id=step.order_id)
    confirmed = [line for line in lines if line.status == LineStatus.CONFIRMED]
    if confirmed:
        OrderLine.objects.filter(
            id__in=[line.id for line in confirmed], status=LineStatus.CONFIRMED
        ).update(status=LineStatus.CANCELLED)
        OrderEvent.objects.bulk_create(
            OrderEvent(
                order_id=step.order_id,
                line_id=line.id,
                kind="cancelled",
                from_status=LineStatus.CONFIRMED,
                to_status=LineStatus.CANCELLED,
                data={"sku": line.sku, "restocked": line.quantity_confirmed},
            )
            for line in confirmed
        )
    # Committed units left on_hand when the order was paid; they come back.
    return {
        line.product_id: line.quantity_confirmed for line in confirmed if line.quantity_confirmed
    }


def step_refund_id(step: CompensationStep, *, generation: int) -> uuid.UUID:
    """The refund id of a refund step's `generation`-th request (0: `return_refund_id` /
    `cancellation_refund_id`; n: uuid5 of "<same>:<n>"). Deterministic: two runners of
    the step, or a retry after a crash, ask under the same id."""
    if step.order_return_id is not None:
        base = f"return:{step.order_return_id}"
    else:
        base = f"cancel:{step.order_id}"
    return uuid.uuid5(NAMESPACE, base if generation == 0 else f"{base}:{generation}")


# A refund step asks again under its next derived refund id only after staff recorded
# the previous one as failed, so this bound is never reached in practice.
MAX_REFUND_GENERATIONS = 100


def _return_value(order_return_id) -> Decimal:
    """The return's lines' value: what it refunds at most (before the budget's cap)."""
    value = ReturnLine.objects.filter(order_return_id=order_return_id).aggregate(
        value=Sum(F("quantity") * F("order_line__unit_price"))
    )["value"]
    return value if value is not None else Decimal(0)


def _refund_done(step: CompensationStep, *, refund_ids: list, amount: Decimal) -> str:
    """The refund step's done transaction: what it refunded is recorded on the step and,
    for a return, as the return's `refund_amount` (the capped amount, 0.00 when nothing)."""
    with _finishing(step) as won:
        if won:
            CompensationStep.objects.filter(id=step.id).update(
                refund_id=refund_ids[-1] if refund_ids else None,
                detail={
                    **({"refund_id": str(refund_ids[-1])} if refund_ids else {}),
                    **({"refund_ids": [str(i) for i in refund_ids]} if len(refund_ids) > 1 else {}),
                    **({} if refund_ids else {"refund": "nothing to refund"}),
                    "amount": format_money(amount),
                },
            )
            if step.order_return_id is not None:
                ReturnRequest.objects.filter(id=step.order_return_id).update(
                    refund_amount=amount, updated_at=Now()
                )
    return "done" if refund_ids else "nothing to refund"


def _refund(step: CompensationStep) -> str:
    """One look at the refund step: its refunds so far decide; then ask, wait, or finish.

    The step's refunds are its derived refund ids by generation
    (`step_refund_id`). A refund staff recorded as `failed` released its
    reservation: the step asks again under the next generation for what is
    still refundable (docs/compensation.md, "No dead ends"). One pending →
    wait; one needing attention → the step needs attention (staff decide
    the refund, then "Retry failed steps"). A return is done with its first
    succeeded refund, or with nothing when nothing is refundable (0.00). A
    cancellation waits until no refund of the order is in progress, then
    refunds everything captured and not refunded, and is done only when
    `amount_refunded = amount_captured`.
    """
    order = Order.objects.get(id=step.order_id)
    is_return = step.order_return_id is not None
    succeeded: list[Refund] = []
    for generation in range(MAX_REFUND_GENERATIONS):
        refund_id = step_refund_id(step, generation=generation)
        refund = Refund.objects.filter(id=refund_id).first()
        if refund is None:
            break
        if refund.status == RefundStatus.FAILED:
            continue  # recorded failed (nothing refunded, reservation released): ask again
        if refund.status == RefundStatus.SUCCEEDED:
            if is_return:
                failpoint("compensation.refund.after_effect")
                return _refund_done(step, refund_ids=[refund.id], amount=refund.amount)
            succeeded.append(refund)
            continue  # a cancellation refunds until nothing captured is left unrefunded
        if refund.status == RefundStatus.NEEDS_ATTENTION:
            raise StepNeedsAttention(
                f"refund {refund.id} is {refund.status}: {refund.last_error or 'see the refund'}"
            )
        _wait(
            step_id=step.id,
            seconds=settings.COMPENSATION_WAIT_SECONDS,
            note=f"waiting for refund {refund.id} ({refund.status})",
        )
        return "waiting"
    else:
        raise StepNeedsAttention(f"more than {MAX_REFUND_GENERATIONS} refunds were asked for")
    payment = Payment.objects.filter(id=order.payment_id).first() if order.payment_id else None
    if is_return:
        at_most = _return_value(step.order_return_id)
        reason = f"return {step.order_return_id}"
        origin = RefundOrigin.RETURN
    else:
        if payment is not None and payment_refunds.refunds_in_progress(payment=payment) > 0:
            # Waits as due work (the row is due again later; no task sleeps), not an
            # attempt. A refund needing staff may take long: the sweeper looks again.
            held = Refund.objects.filter(payment_id=payment.id, needs_attention=True).exists()
            _wait(
                step_id=step.id,
                seconds=(
                    settings.COMPENSATION_REFUND_HELD_RECHECK
                    if held
                    else settings.COMPENSATION_WAIT_SECONDS
                ),
                note="waiting: a refund of the order is in progress",
                ring=not held,
            )
            return "waiting"
        at_most = (
            payment.amount_captured - payment.amount_refunded if payment is not None else Decimal(0)
        )
        reason = f"cancellation of order {order.number}"
        origin = RefundOrigin.CANCELLATION
    if payment is None or at_most <= 0:
        return _refund_done(
            step,
            refund_ids=[r.id for r in succeeded],
            amount=sum((r.amount for r in succeeded), Decimal(0)),
        )
    CompensationStep.objects.filter(id=step.id).update(refund_id=refund_id)
    try:
        refund = payment_refunds.refund_request_capped(
            refund_id=refund_id,
            payment_id=payment.id,
            at_most=at_most,
            reason=reason,
            origin=origin,
        )
    except ApplicationError as exc:  # 409: another payment holds the refund id
        raise StepNeedsAttention(f"the refund was refused: {exc.code}: {exc.detail}") from exc
    if refund is None:  # nothing refundable left: 0.00, and the run goes on
        return _refund_done(
            step,
            refund_ids=[r.id for r in succeeded],
            amount=sum((r.amount for r in succeeded), Decimal(0)),
        )
    failpoint("compensation.refund.after_effect")
    # Requested (pending): the `payments.refund` task calls the provider; look again soon.
    _wait(
        step_id=step.id,
        seconds=settings.COMPENSATION_WAIT_SECONDS,
        note=f"waiting for refund {refund.id} ({refund.status})",
    )
    return "waiting"


def _event_payload(step: CompensationStep) -> tuple[str, dict]:
    order = Order.objects.get(id=step.order_id)
    if step.order_return_id is None:
        return "order.cancelled", order_event_payload(order=order)
    order_return = ReturnRequest.objects.get(id=step.order_return_id)
    lines = order_return.lines.select_related("order_line").order_by("order_line__position")
    return "return.completed", {
        "order_id": str(order.id),
        "number": order.number,
        "owner_id": order.owner_id,
        "return_id": str(order_return.id),
        "currency": order.currency,
        "lines": [
            {
                "sku": line.sku,
                "quantity": line.quantity,
                "unit_price": format_money(line.order_line.unit_price),
            }
            for line in lines
        ],
    }


def _publish_once(step: CompensationStep) -> str:
    """history / loyalty: the one outbox event, by whichever of the two is done first."""
    with _finishing(step) as won:
        if not won:
            return "already done"
        # The parent is locked: a sibling done before us has committed, or waits for us.
        written = (
            _siblings(step)
            .filter(name__in=EVENT_STEPS, done_at__isnull=False)
            .exclude(id=step.id)
            .values_list("detail", flat=True)
            .first()
        )
        if written is None:
            event_type, payload = _event_payload(step)
            message = outbox_write(
                aggregate_type="order",
                aggregate_id=str(step.order_id),
                event_type=event_type,
                payload=payload,
            )
            detail = {
                "outbox_message_id": str(message.id),
                "event_type": event_type,
                "written": True,
            }
        else:
            detail = {**written, "written": False}
        CompensationStep.objects.filter(id=step.id).update(detail=detail)
    return "done"


def _notify(step: CompensationStep) -> str:
    order = Order.objects.select_related("owner").get(id=step.order_id)
    email = getattr(order.owner, "email", "") or ""
    if step.order_return_id is not None:
        subject = f"Your return for order {order.number} is complete"
        body = "We received your return and refunded it."
    else:
        subject = f"Order {order.number} is cancelled"
        body = "Your order is cancelled and what you paid is refunded."
    if email:
        # At least once: a crash after this line and before the done commit sends it again.
        send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [email])
    failpoint("compensation.notify.after_effect")
    with _finishing(step) as won:
        if won:
            CompensationStep.objects.filter(id=step.id).update(detail={"sent_to": email or None})
    return "done"


# Keyed by the step's name as stored (a plain str, equal to its StepName).
_HANDLERS: dict[str, Callable[[CompensationStep], str]] = {
    StepName.RESTOCK: _restock,
    StepName.REFUND: _refund,
    StepName.HISTORY: _publish_once,
    StepName.LOYALTY: _publish_once,
    StepName.NOTIFY: _notify,
}


# -- staff ----------------------------------------------------------------------------------


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
            parent = _lock_parent(step)
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
            _event(
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


def steps_sweep(*, limit: int) -> int:
    """Beat: enqueue every due step (core.due.sweep)."""
    return len(due.sweep(CompensationStep, limit=limit))
