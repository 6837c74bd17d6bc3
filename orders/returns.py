"""Returns: a shopper asks, staff (or a warehouse scanner) receive, compensation runs.

`return_request` counts what each line may still return under the order's
row lock (then its lines, `orders.lock_objects`): returnable = shipped −
returned − in open (`requested`) returns. Two returns racing for the same
units queue on the lock; the second counts the first and is refused with
422 `return_exceeds_order`.

`return_receive` is decided by ONE conditional UPDATE requested → processing:
a double click, two staff, the admin and the scanner at once — exactly one
caller's UPDATE matches the row, and only that transaction moves the units
into the lines' `quantity_returned` and inserts the step rows
(`orders.compensation.steps_insert`). Everyone else reads the return as it
is (202 with the current body either way).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from django.db import transaction
from django.db.models import F, Sum
from django.db.models.functions import Now
from django.utils.translation import gettext as _

from core.db import insert_first
from core.errors import ApplicationError, InvalidRequest, InvalidState, NotFound
from idempotency.failpoints import failpoint

from . import compensation, lock_objects
from .models import OrderEvent, OrderLine, ReturnLine, ReturnRequest
from .shipments import SHIPPABLE_ORDER_STATUSES
from .states import CompensationKind, ReturnStatus


class ReturnExceedsOrder(ApplicationError):
    status = 422
    code = "return_exceeds_order"
    title = "Return exceeds order"


class LineNotShipped(ApplicationError):
    status = 422
    code = "line_not_shipped"
    title = "Line not shipped"


class ReturnInvalidState(InvalidState):
    """Refuse a return of an order that cannot take one (409 `invalid_state`)."""


@dataclass(frozen=True)
class ReturnLineRequest:
    sku: str
    quantity: int


def _open_units(*, order_id) -> dict[int, int]:
    """Units per order line in the order's open (`requested`) returns."""
    rows = (
        ReturnLine.objects.filter(
            order_return__order_id=order_id, order_return__status=ReturnStatus.REQUESTED
        )
        .values("order_line_id")
        .annotate(units=Sum("quantity"))
    )
    return {row["order_line_id"]: row["units"] for row in rows}


RETURN_FORM_SCOPE_UNIQ = "orders_return_form_scope_uniq"


@transaction.atomic
def return_request(
    *,
    order_id,
    lines: Sequence[ReturnLineRequest],
    reason: str,
    requested_by=None,
    form_scope: str | None = None,
) -> ReturnRequest:
    """Ask to return shipped units of an order; a refusal rolls back everything written.

    A sku not in the order → 400; a line with nothing shipped → 422
    `line_not_shipped`; more than shipped − returned − in open returns →
    422 `return_exceeds_order` (with `returnable` per line).

    The return row is inserted FIRST (after the 400, before the domain's
    refusals) with `form_scope` (the storefront form's owner and key as rendered,
    shop.returns.return_form_key): the same form sent again, even after its
    request key was purged, violates `orders_return_form_scope_uniq` and
    answers the return it made (docs/idempotency.md, "Business scopes that
    outlive request keys").
    """
    skus = [line.sku for line in lines]
    assert lines and len(set(skus)) == len(skus), "lines must be non-empty with distinct skus"
    assert all(line.quantity >= 1 for line in lines), "quantities are positive"
    order = lock_objects.order_lock(order_id=order_id)
    order_lines = lock_objects.order_lines_lock(order_id=order_id)
    failpoint("returns.request.locked")
    by_sku = {line.sku: line for line in order_lines}
    unknown = {
        index: {"sku": ["Not a line of this order."]}
        for index, line in enumerate(lines)
        if line.sku not in by_sku
    }
    if unknown:
        raise InvalidRequest(
            _("A return line names a sku the order does not have."), errors={"lines": unknown}
        )
    amount = sum((by_sku[line.sku].unit_price * line.quantity for line in lines), Decimal(0))
    order_return = ReturnRequest(
        order=order,
        status=ReturnStatus.REQUESTED,
        reason=reason[:500],
        refund_amount=amount,
        currency=order.currency,
        requested_by=requested_by,
        form_scope=form_scope,
    )
    if not insert_first(order_return, constraint=RETURN_FORM_SCOPE_UNIQ):
        made = ReturnRequest.objects.get(form_scope=form_scope)
        made.line_list = list(made.lines.order_by("id"))
        made.step_list = list(made.steps.order_by("position"))
        return made
    not_shipped = [
        {"index": index, "sku": line.sku}
        for index, line in enumerate(lines)
        if by_sku[line.sku].quantity_shipped == 0
    ]
    if not_shipped or order.status not in SHIPPABLE_ORDER_STATUSES:
        raise LineNotShipped(
            _("Only shipped units can be returned."), errors={"lines": not_shipped}
        )
    open_units = _open_units(order_id=order.id)
    over = []
    for index, line in enumerate(lines):
        order_line = by_sku[line.sku]
        returnable = (
            order_line.quantity_shipped
            - order_line.quantity_returned
            - open_units.get(order_line.id, 0)
        )
        if line.quantity > returnable:
            over.append(
                {
                    "index": index,
                    "sku": line.sku,
                    "requested": line.quantity,
                    "returnable": max(returnable, 0),
                }
            )
    if over:
        raise ReturnExceedsOrder(
            _("More units than were shipped and are not yet returned or being returned."),
            errors={"lines": over},
        )
    order_return.line_list = ReturnLine.objects.bulk_create(
        ReturnLine(
            order_return=order_return,
            order_line=by_sku[line.sku],
            sku=line.sku,
            quantity=line.quantity,
        )
        for line in lines
    )
    OrderEvent.objects.create(
        order=order,
        kind="return_requested",
        from_status=None,
        to_status=ReturnStatus.REQUESTED,
        data={
            "return_id": str(order_return.id),
            "lines": [{"sku": line.sku, "quantity": line.quantity} for line in lines],
        },
    )
    order_return.step_list = []
    return order_return


def _start(order_return: ReturnRequest, *, by) -> None:
    """The winner of requested → processing: units returned, steps inserted, event written."""
    lines = list(order_return.lines.all())
    for line in lines:
        moved = OrderLine.objects.filter(
            id=line.order_line_id,
            quantity_returned__lte=F("quantity_shipped") - line.quantity,
        ).update(quantity_returned=F("quantity_returned") + line.quantity)
        assert moved == 1, f"line {line.order_line_id} cannot take {line.quantity} returned units"
    compensation.steps_insert(
        order_id=order_return.order_id,
        kind=CompensationKind.RETURN,
        order_return_id=order_return.id,
    )
    OrderEvent.objects.create(
        order_id=order_return.order_id,
        kind="return_received",
        from_status=ReturnStatus.REQUESTED,
        to_status=ReturnStatus.PROCESSING,
        data={"return_id": str(order_return.id), "by": getattr(by, "username", None)},
    )


@transaction.atomic
def return_receive(*, return_id, by=None) -> ReturnRequest:
    """Mark a return received and start its compensation, once; return it as it now is.

    ONE conditional UPDATE (`status = 'requested'`) decides: only the
    transaction whose UPDATE matched inserts the steps. Already received
    (processing, completed, needs attention) → returned unchanged.
    """
    failpoint("returns.receive.before_decide")
    won = ReturnRequest.objects.filter(id=return_id, status=ReturnStatus.REQUESTED).update(
        status=ReturnStatus.PROCESSING,
        received_at=Now(),
        received_by=by,
        updated_at=Now(),
    )
    order_return = ReturnRequest.objects.get(id=return_id)
    if won:
        _start(order_return, by=by)
    order_return.started = bool(won)
    return order_return


# -- reads ------------------------------------------------------------------------------------


def return_get(*, return_id) -> ReturnRequest:
    """One return with its lines and steps (no permission check); unknown or malformed: 404."""
    try:
        return_uuid = uuid.UUID(str(return_id))
    except ValueError:
        raise NotFound(_("No such return.")) from None
    order_return = ReturnRequest.objects.select_related("order").filter(id=return_uuid).first()
    if order_return is None:
        raise NotFound(_("No such return."))
    return order_return


def return_get_for_user(*, user, return_id) -> ReturnRequest:
    """A return `user` may read: of their own order (staff: any); anyone else's is 404."""
    order_return = return_get(return_id=return_id)
    if not user.is_staff and order_return.order.owner_id != user.pk:
        raise NotFound(_("No such return."))
    return order_return


def returnable_units(*, order_id, order_lines) -> dict[int, int]:
    """Units each of `order_lines` may still return, as of now (a read for a form: the request
    counts again under the order's lock): shipped − returned − in open returns."""
    open_units = _open_units(order_id=order_id)
    return {
        line.id: max(line.quantity_shipped - line.quantity_returned - open_units.get(line.id, 0), 0)
        for line in order_lines
    }


def returns_of_order(*, order_id) -> list[ReturnRequest]:
    return list(ReturnRequest.objects.filter(order_id=order_id).order_by("created_at", "id"))
