"""Shipments: confirmed units leave the warehouse, counted under the order's row lock.

`shipment_create` locks the order row (then its lines, primary-key order,
`orders.lock_objects`), so two shipments racing for the same units queue:
the second one counts what the first one shipped and is refused with 422
`exceeds_unshipped` instead of shipping them again. A line's
`quantity_shipped` rises by one conditional UPDATE (and the database's
CHECK `quantity_shipped <= quantity_confirmed` backs it up); the order's
`fulfillment` follows, and the order event and outbox row are written in
the same transaction.

The keyed glue (POST /orders/{id}/shipments/) is one phase: the API view
claims the key, calls `shipment_create` inside the phase and stores the
rendered body with the shipment (docs/shipments.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now
from django.utils.translation import gettext as _

from core.db import insert_first
from core.errors import ApplicationError, InvalidRequest, InvalidState
from idempotency.failpoints import failpoint
from idempotency.messaging.outbox import outbox_write

from . import lock_objects
from .event_types import OrderEventType
from .models import Order, OrderEvent, OrderLine, Shipment, ShipmentLine
from .states import FULFILLMENT_TRANSITIONS, Fulfillment, LineStatus, OrderStatus, check_transition

FORM_SCOPE_UNIQ = "orders_shipment_form_scope_uniq"
SHIPPABLE_ORDER_STATUSES = frozenset({OrderStatus.CONFIRMED, OrderStatus.PARTIALLY_CONFIRMED})


class ExceedsUnshipped(ApplicationError):
    status = 422
    code = "exceeds_unshipped"
    title = "Exceeds unshipped"


class OrderNotShippable(InvalidState):
    """Refuse to ship an order that is not confirmed (409 `invalid_state`)."""


@dataclass(frozen=True)
class ShipmentLineRequest:
    """One line of a shipment request: a sku of the order and the units to ship."""

    sku: str
    quantity: int


def _unshipped(line: OrderLine) -> int:
    if line.status != LineStatus.CONFIRMED:
        return 0
    return line.quantity_confirmed - line.quantity_shipped


def _fulfillment(lines: Sequence[OrderLine]) -> str:
    confirmed = [line for line in lines if line.status == LineStatus.CONFIRMED]
    if not any(line.quantity_shipped for line in confirmed):
        return Fulfillment.UNFULFILLED
    if all(line.quantity_shipped >= line.quantity_confirmed for line in confirmed):
        return Fulfillment.SHIPPED
    return Fulfillment.PARTIALLY_SHIPPED


def _wanted(
    *, order_lines: Sequence[OrderLine], lines: Sequence[ShipmentLineRequest] | None
) -> list[tuple[OrderLine, int]]:
    """Return (order line, units) to ship, or raise the refusal (nothing is written yet)."""
    if lines is None:
        wanted = [(line, _unshipped(line)) for line in order_lines if _unshipped(line) > 0]
        if not wanted:
            raise ExceedsUnshipped(_("Every confirmed unit of this order has shipped already."))
        return wanted
    by_sku = {line.sku: line for line in order_lines}
    unknown = {
        index: {"sku": [_("Not a line of this order.")]}
        for index, line in enumerate(lines)
        if line.sku not in by_sku
    }
    if unknown:
        raise InvalidRequest(
            _("A shipment line names a sku the order does not have."), errors={"lines": unknown}
        )
    wanted = [(by_sku[line.sku], line.quantity) for line in lines]
    over = [
        {
            "index": index,
            "sku": line.sku,
            "requested": units,
            "unshipped": _unshipped(line),
        }
        for index, (line, units) in enumerate(wanted)
        if units > _unshipped(line)
    ]
    if over:
        raise ExceedsUnshipped(
            _("More units than are confirmed and not yet shipped."), errors={"lines": over}
        )
    return wanted


@transaction.atomic
def shipment_create(
    *,
    order_id,
    lines: Sequence[ShipmentLineRequest] | None,
    carrier: str | None,
    tracking_number: str | None,
    form_scope: str | None = None,
) -> Shipment:
    """Ship confirmed units of an order: `lines` (None = everything confirmed and unshipped).

    Refusals, raised before anything else is written: an order that is not
    confirmed → 409 `invalid_state`; a sku not in the order → 400; more
    units than confirmed and not yet shipped → 422 `exceeds_unshipped`.

    `form_scope` (the admin form's owner and key as rendered, orders.admin.forms) is
    inserted FIRST with the shipment row: the same form sent again, even
    after its request key was purged, violates `orders_shipment_form_scope_uniq`
    and answers the shipment it made (docs/idempotency.md, "Business scopes
    that outlive request keys").
    """
    skus = [line.sku for line in lines or ()]
    assert len(set(skus)) == len(skus), "a sku may appear once per shipment"
    assert all(line.quantity >= 1 for line in lines or ()), "quantities are positive"
    order = lock_objects.order_lock(order_id=order_id)
    order_lines = lock_objects.order_lines_lock(order_id=order_id)
    failpoint("shipment.create.locked")
    shipment = Shipment(
        order=order,
        carrier=carrier or None,
        tracking_number=tracking_number or None,
        form_scope=form_scope,
    )
    if not insert_first(shipment, constraint=FORM_SCOPE_UNIQ):
        made = Shipment.objects.get(form_scope=form_scope)
        made.line_list = list(made.lines.order_by("id"))  # type: ignore[attr-defined]
        return made
    if order.status not in SHIPPABLE_ORDER_STATUSES:
        raise OrderNotShippable(
            _("An order that is {status} cannot ship; only confirmed orders can.").format(
                status=order.status
            ),
            extra={"order_id": str(order.id)},
        )
    wanted = _wanted(order_lines=order_lines, lines=lines)
    shipment_lines = ShipmentLine.objects.bulk_create(
        ShipmentLine(shipment=shipment, order_line=line, sku=line.sku, quantity=units)
        for line, units in wanted
    )
    for line, units in wanted:
        # Under the order's lock nothing else ships this line; the condition
        # states the invariant anyway (and the CHECK constraint backs it).
        moved = OrderLine.objects.filter(
            id=line.id, quantity_shipped__lte=F("quantity_confirmed") - units
        ).update(quantity_shipped=F("quantity_shipped") + units)
        assert moved == 1, f"line {line.id} changed under the order's lock"
        line.quantity_shipped += units

    before, after = order.fulfillment, _fulfillment(order_lines)
    if after != before:
        check_transition(FULFILLMENT_TRANSITIONS, before, after)
        Order.objects.filter(id=order.id).update(fulfillment=after, updated_at=Now())
        order.fulfillment = after
    lines_data = [{"sku": line.sku, "quantity": line.quantity} for line in shipment_lines]
    OrderEvent.objects.create(
        order=order,
        kind="shipped",
        from_status=before,
        to_status=after,
        data={"shipment_id": str(shipment.id), "lines": lines_data},
    )
    outbox_write(
        aggregate_type="order",
        aggregate_id=str(order.id),
        event_type=OrderEventType.SHIPMENT_CREATED,
        payload={
            "order_id": str(order.id),
            "number": order.number,
            "owner_id": order.owner_id,
            "shipment_id": str(shipment.id),
            "fulfillment": after,
            "carrier": shipment.carrier,
            "tracking_number": shipment.tracking_number,
            "lines": lines_data,
        },
    )
    # The plugin knows line_list only where selectors prefetch it (to_attr).
    shipment.line_list = shipment_lines  # type: ignore[attr-defined]
    return shipment
