"""The compensation steps that are not the refund: restock, the one outbox event, the e-mail.

    restock   on_hand += units (F()) in the transaction that marks it done
              (exactly once: both commit or neither)
    history,  the ONE outbox event (`return.completed` / `order.cancelled`),
    loyalty   written in the done transaction of whichever of the two comes
              first; the consumers dedupe by outbox id. Done when written.
    notify    an e-mail through Django's email backend, in the order's language,
              then done: at least once (a crash between the two sends it again)

Each takes the step and the attempt the run took (unused here: none of these
waits). The refund step is `orders.compensation.refund`; the run that calls
these is `orders.compensation.run`.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.mail import send_mail
from django.utils import translation
from django.utils.translation import gettext as _

from core import due
from core.money import format_money
from idempotency.failpoints import failpoint
from idempotency.messaging.outbox import outbox_write
from inventory import services as inventory_services

from .. import lock_objects
from ..event_types import OrderEventType
from ..models import CompensationStep, Order, OrderEvent, OrderLine, ReturnRequest
from ..states import LineStatus, StepName
from ..transitions import order_event_payload
from .state import finishing, siblings

EVENT_STEPS = frozenset({StepName.HISTORY, StepName.LOYALTY})


def restock(step: CompensationStep, attempt: due.Attempt) -> str:
    with finishing(step) as won:
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


def _event_payload(step: CompensationStep) -> tuple[OrderEventType, dict]:
    order = Order.objects.get(id=step.order_id)
    if step.order_return_id is None:
        return OrderEventType.CANCELLED, order_event_payload(order=order)
    order_return = ReturnRequest.objects.get(id=step.order_return_id)
    lines = order_return.lines.select_related("order_line").order_by("order_line__position")
    return OrderEventType.RETURN_COMPLETED, {
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


def publish_once(step: CompensationStep, attempt: due.Attempt) -> str:
    """history / loyalty: the one outbox event, by whichever of the two is done first."""
    with finishing(step) as won:
        if not won:
            return "already done"
        # The parent is locked: a sibling done before us has committed, or waits for us.
        written = (
            siblings(step)
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


def notify(step: CompensationStep, attempt: due.Attempt) -> str:
    order = Order.objects.select_related("owner").get(id=step.order_id)
    email = getattr(order.owner, "email", "") or ""
    # In the language the order was placed in (docs/storefront.md, "Languages").
    with translation.override(order.language):
        if step.order_return_id is not None:
            subject = _("Your return for order {number} is complete").format(number=order.number)
            body = _("We received your return and refunded it.")
        else:
            subject = _("Order {number} is cancelled").format(number=order.number)
            body = _("Your order is cancelled and what you paid is refunded.")
    if email:
        # At least once: a crash after this line and before the done commit sends it again.
        send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [email])
    failpoint("compensation.notify.after_effect")
    with finishing(step) as won:
        if won:
            CompensationStep.objects.filter(id=step.id).update(detail={"sent_to": email or None})
    return "done"
