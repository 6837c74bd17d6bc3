"""The compensation's refund step, under refund ids derived from what it compensates.

`payments.refunds.refund_request_capped` under a refund id DERIVED from the
return / cancellation (uuid5, `step_refund_id`): asking again is the same
refund; done when that refund succeeded; a refund that needs attention (or
is refused) fails the step → needs attention. docs/compensation.md, "One
refund budget".
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.db.models import F, Sum
from django.db.models.functions import Now

from core import due
from core.errors import ApplicationError
from core.money import format_money
from idempotency.failpoints import failpoint
from payments import refunds as payment_refunds
from payments import selectors as payment_selectors
from payments.states import RefundOrigin, RefundStatus

from .. import lock_objects
from ..models import CompensationStep, Order, ReturnLine, ReturnRequest
from .state import StepNeedsAttention, finishing, step_wait

if TYPE_CHECKING:  # an annotation only: refunds are read through payments' selectors
    from payments.models import Refund

# Refund ids of compensation are derived from what they compensate, never random:
# uuid5(NAMESPACE, "return:<return id>") and uuid5(NAMESPACE, "cancel:<order id>").
NAMESPACE = uuid.UUID("6f1f3c2e-8a4b-5d7e-9c10-2b3a4d5e6f70")


def return_refund_id(return_id) -> uuid.UUID:
    return uuid.uuid5(NAMESPACE, f"return:{return_id}")


def cancellation_refund_id(order_id) -> uuid.UUID:
    return uuid.uuid5(NAMESPACE, f"cancel:{order_id}")


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
    with finishing(step) as won:
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


def refund_step(step: CompensationStep, attempt: due.Attempt) -> str:
    """One look at the refund step: its refunds so far decide; then ask, wait, or finish.

    The step's refunds are its derived refund ids by generation
    (`step_refund_id`). A refund staff recorded as `failed` released its
    reservation: the step asks again under the next generation for what is
    still refundable (docs/compensation.md, "No dead ends"). One pending →
    wait; one needing attention → the step needs attention (staff decide
    the refund, then "Retry failed steps"). A return and a cancellation
    read their refunds alike and decide apart (`_return_refund`,
    `_cancellation_refund`).
    """
    if step.order_return_id is not None:
        return _return_refund(step, attempt)
    return _cancellation_refund(step, attempt)


def _refunds_not_failed(step: CompensationStep) -> Iterator[tuple[uuid.UUID, Refund | None]]:
    """The step's refunds by generation, those recorded `failed` left out, up to and with the
    first refund id not asked for yet (its refund None). Read lazily: the caller stops early.
    """
    for generation in range(MAX_REFUND_GENERATIONS):
        refund_id = step_refund_id(step, generation=generation)
        refund = payment_selectors.refund_get_or_none(refund_id=refund_id)
        if refund is None:
            yield refund_id, None
            return
        if refund.status != RefundStatus.FAILED:
            yield refund_id, refund
    raise StepNeedsAttention(f"more than {MAX_REFUND_GENERATIONS} refunds were asked for")


def _unsettled(step: CompensationStep, attempt: due.Attempt, refund: Refund) -> str:
    """A refund neither succeeded nor failed: needing attention, the step does; else wait."""
    if refund.status == RefundStatus.NEEDS_ATTENTION:
        raise StepNeedsAttention(
            f"refund {refund.id} is {refund.status}: {refund.last_error or 'see the refund'}"
        )
    _wait_for(step, attempt, refund)
    return "waiting"


def _return_refund(step: CompensationStep, attempt: due.Attempt) -> str:
    """A return: its first refund not recorded failed decides. Succeeded → done with it;
    none yet → ask (`_return_request`); else wait or need attention (`_unsettled`)."""
    refund_id, refund = next(_refunds_not_failed(step))
    if refund is None:
        return _return_request(step, attempt, refund_id=refund_id)
    if refund.status == RefundStatus.SUCCEEDED:
        failpoint("compensation.refund.after_effect")
        return _refund_done(step, refund_ids=[refund.id], amount=refund.amount)
    return _unsettled(step, attempt, refund)


def _return_request(step: CompensationStep, attempt: due.Attempt, *, refund_id) -> str:
    """Ask for the return's value, capped by what is still refundable; with nothing to
    refund (no payment, no value, nothing left) the step is done at 0.00."""
    order = Order.objects.get(id=step.order_id)
    payment = (
        payment_selectors.payment_get_or_none(payment_id=order.payment_id)
        if order.payment_id
        else None
    )
    at_most = _return_value(step.order_return_id)
    if payment is None or at_most <= 0:
        return _refund_done(step, refund_ids=[], amount=Decimal(0))
    CompensationStep.objects.filter(id=step.id).update(refund_id=refund_id)
    try:
        refund = payment_refunds.refund_request_capped(
            refund_id=refund_id,
            payment_id=payment.id,
            at_most=at_most,
            reason=f"return {step.order_return_id}",
            origin=RefundOrigin.RETURN,
        )
    except ApplicationError as exc:  # 409: another payment holds the refund id
        raise StepNeedsAttention(f"the refund was refused: {exc.code}: {exc.detail}") from exc
    if refund is None:  # nothing refundable left: 0.00, and the run goes on
        return _refund_done(step, refund_ids=[], amount=Decimal(0))
    return _asked(step, attempt, refund)


def _cancellation_refund(step: CompensationStep, attempt: due.Attempt) -> str:
    """A cancellation: its succeeded refunds add up; the first one neither succeeded nor
    failed waits or needs attention (`_unsettled`); none left → `_cancellation_request`
    asks for the rest, or finishes once `amount_refunded = amount_captured`."""
    succeeded: list[Refund] = []
    refunds = _refunds_not_failed(step)
    refund_id, refund = next(refunds)
    while refund is not None and refund.status == RefundStatus.SUCCEEDED:
        succeeded.append(refund)
        refund_id, refund = next(refunds)
    if refund is not None:
        return _unsettled(step, attempt, refund)
    return _cancellation_request(step, attempt, refund_id=refund_id, succeeded=succeeded)


def _wait_for(step: CompensationStep, attempt: due.Attempt, refund: Refund) -> None:
    step_wait(
        step_id=step.id,
        attempt=attempt,
        seconds=settings.COMPENSATION_WAIT_SECONDS,
        note=f"waiting for refund {refund.id} ({refund.status})",
    )


def _asked(step: CompensationStep, attempt: due.Attempt, refund: Refund) -> str:
    """Requested (pending): the `payments.refund` task calls the provider; look again soon."""
    failpoint("compensation.refund.after_effect")
    _wait_for(step, attempt, refund)
    return "waiting"


def _cancellation_request(
    step: CompensationStep, attempt: due.Attempt, *, refund_id, succeeded: list[Refund]
) -> str:
    """A cancellation's request: everything captured and not refunded, decided under the lock.

    One transaction holds the payment's row lock (`order_read_payment_lock`,
    the lock every refund request takes before it reserves) while it reads
    "refunds in progress" and the cap, and then either asks for the rest
    (the reservation in the same transaction), or, with nothing in progress
    and `amount_refunded = amount_captured`, marks the step done. A goodwill
    refund asked meanwhile comes before (the step waits for it) or after (it
    finds nothing refundable), never between the read and the request.
    Read without the lock, a goodwill refund of everything between the two
    left the step done with nothing refunded (docs/compensation.md, "One
    refund budget"). The provider is called later, by the refund's task.
    """
    wait: tuple[str, float, bool] | None = None
    refund: Refund | None = None
    try:
        with transaction.atomic():
            order = lock_objects.order_read_payment_lock(order_id=step.order_id)
            payment = order.payment if order.payment_id is not None else None
            in_progress = (
                payment_refunds.refunds_in_progress(payment=payment) if payment else Decimal(0)
            )
            at_most = payment.amount_captured - payment.amount_refunded if payment else Decimal(0)
            failpoint("compensation.refund.budget_read")
            if payment is not None and in_progress > 0:
                # Waits as due work (the row is due again later; no task sleeps), not an
                # attempt. A refund needing staff may take long: the sweeper looks again.
                held = payment_selectors.payment_has_refund_needing_attention(payment_id=payment.id)
                wait = (
                    "waiting: a refund of the order is in progress",
                    settings.COMPENSATION_REFUND_HELD_RECHECK
                    if held
                    else settings.COMPENSATION_WAIT_SECONDS,
                    not held,
                )
            elif payment is None or at_most <= 0:
                return _refund_done(
                    step,
                    refund_ids=[r.id for r in succeeded],
                    amount=sum((r.amount for r in succeeded), Decimal(0)),
                )
            else:
                CompensationStep.objects.filter(id=step.id).update(refund_id=refund_id)
                refund = payment_refunds.refund_request(
                    refund_id=refund_id,
                    payment_id=payment.id,
                    amount=at_most,
                    reason=f"cancellation of order {order.number}",
                    origin=RefundOrigin.CANCELLATION,
                )
    except ApplicationError as exc:  # 409: not refundable, or another payment holds the id
        raise StepNeedsAttention(f"the refund was refused: {exc.code}: {exc.detail}") from exc
    if wait is not None:
        note, seconds, ring = wait
        step_wait(step_id=step.id, attempt=attempt, seconds=seconds, note=note, ring=ring)
        return "waiting"
    assert refund is not None
    return _asked(step, attempt, refund)
