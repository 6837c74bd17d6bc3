"""The order's, the line's and fulfillment's state machines, as visible tables.

A status changes only along these arrows (`None` is "not yet created"), by a
conditional UPDATE that names the source status, and each change writes an
`OrderEvent` in the same transaction. Cancelling a confirmed order
(`cancelling` → `cancelled`) is driven by its compensation steps
(docs/compensation.md); returns and steps have their machines here too.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import pgettext_lazy


class OrderStatus(models.TextChoices):
    AWAITING_DECISION = "awaiting_decision", pgettext_lazy("order status", "Awaiting Decision")
    PAYMENT_PENDING = "payment_pending", pgettext_lazy("order status", "Payment Pending")
    CONFIRMED = "confirmed", pgettext_lazy("order status", "Confirmed")
    PARTIALLY_CONFIRMED = (
        "partially_confirmed",
        pgettext_lazy("order status", "Partially Confirmed"),
    )
    PAYMENT_FAILED = "payment_failed", pgettext_lazy("order status", "Payment Failed")
    CANCELLING = "cancelling", pgettext_lazy("order status", "Cancelling")
    CANCELLED = "cancelled", pgettext_lazy("order status", "Cancelled")
    EXPIRED = "expired", pgettext_lazy("order status", "Expired")


class LineStatus(models.TextChoices):
    RESERVED = "reserved", pgettext_lazy("order line status", "Reserved")
    CONFIRMED = "confirmed", pgettext_lazy("order line status", "Confirmed")
    UNAVAILABLE = "unavailable", pgettext_lazy("order line status", "Unavailable")
    RELEASED = "released", pgettext_lazy("order line status", "Released")
    CANCELLED = "cancelled", pgettext_lazy("order line status", "Cancelled")


class Fulfillment(models.TextChoices):
    UNFULFILLED = "unfulfilled", pgettext_lazy("fulfillment", "Unfulfilled")
    PARTIALLY_SHIPPED = "partially_shipped", pgettext_lazy("fulfillment", "Partially Shipped")
    SHIPPED = "shipped", pgettext_lazy("fulfillment", "Shipped")


class OnShortage(models.TextChoices):
    REJECT = "reject", pgettext_lazy("on shortage", "Reject")
    PARTIAL = "partial", pgettext_lazy("on shortage", "Partial")
    ASK = "ask", pgettext_lazy("on shortage", "Ask")


ORDER_TRANSITIONS: dict[str | None, frozenset[str]] = {
    # Created with every flag held: the payment is being taken, or the
    # shopper is asked whether to take the shortened order.
    None: frozenset({OrderStatus.PAYMENT_PENDING, OrderStatus.AWAITING_DECISION}),
    OrderStatus.AWAITING_DECISION: frozenset(
        {OrderStatus.PAYMENT_PENDING, OrderStatus.CANCELLED, OrderStatus.EXPIRED}
    ),
    OrderStatus.PAYMENT_PENDING: frozenset(
        {OrderStatus.CONFIRMED, OrderStatus.PARTIALLY_CONFIRMED, OrderStatus.PAYMENT_FAILED}
    ),
    # A confirmed order's cancellation: compensation steps, then cancelled.
    OrderStatus.CONFIRMED: frozenset({OrderStatus.CANCELLING}),
    OrderStatus.PARTIALLY_CONFIRMED: frozenset({OrderStatus.CANCELLING}),
    OrderStatus.CANCELLING: frozenset({OrderStatus.CANCELLED}),
    OrderStatus.PAYMENT_FAILED: frozenset(),
    OrderStatus.CANCELLED: frozenset(),
    OrderStatus.EXPIRED: frozenset(),
}

LINE_TRANSITIONS: dict[str | None, frozenset[str]] = {
    None: frozenset({LineStatus.RESERVED, LineStatus.UNAVAILABLE}),
    # confirmed: paid and committed; released: flag released because the payment
    # failed or the decision expired; cancelled: the shopper cancelled.
    LineStatus.RESERVED: frozenset(
        {LineStatus.CONFIRMED, LineStatus.RELEASED, LineStatus.CANCELLED}
    ),
    LineStatus.CONFIRMED: frozenset({LineStatus.CANCELLED}),
    LineStatus.UNAVAILABLE: frozenset(),
    LineStatus.RELEASED: frozenset(),
    LineStatus.CANCELLED: frozenset(),
}

FULFILLMENT_TRANSITIONS: dict[str, frozenset[str]] = {
    Fulfillment.UNFULFILLED: frozenset({Fulfillment.PARTIALLY_SHIPPED, Fulfillment.SHIPPED}),
    Fulfillment.PARTIALLY_SHIPPED: frozenset({Fulfillment.SHIPPED}),
    Fulfillment.SHIPPED: frozenset(),
}

# Orders whose flags are held: their units are not available to anyone else.
HOLDING_STATUSES = frozenset({OrderStatus.AWAITING_DECISION, OrderStatus.PAYMENT_PENDING})


class IllegalTransition(AssertionError):
    """A programming error: code asked for a transition the tables do not allow."""


def check_transition(table: dict, source: str | None, target: str) -> None:
    """Raise IllegalTransition unless `source → target` is an arrow of `table`."""
    if target not in table.get(source, frozenset()):
        raise IllegalTransition(f"{source} → {target} is not allowed")


class TrackingStatus(models.TextChoices):
    """What a courier may report about a shipment (docs/shipments.md)."""

    LABEL_CREATED = "label_created", pgettext_lazy("tracking status", "Label Created")
    PICKED_UP = "picked_up", pgettext_lazy("tracking status", "Picked Up")
    IN_TRANSIT = "in_transit", pgettext_lazy("tracking status", "In Transit")
    OUT_FOR_DELIVERY = "out_for_delivery", pgettext_lazy("tracking status", "Out For Delivery")
    DELIVERED = "delivered", pgettext_lazy("tracking status", "Delivered")
    EXCEPTION = "exception", pgettext_lazy("tracking status", "Exception")


class ReturnStatus(models.TextChoices):
    """A return's statuses (contract: "Returns")."""

    # the shopper asked; the units are not back yet (an open return)
    REQUESTED = "requested", pgettext_lazy("return status", "Requested")
    # received: its compensation steps are running
    PROCESSING = "processing", pgettext_lazy("return status", "Processing")
    COMPLETED = "completed", pgettext_lazy("return status", "Completed")  # every step done
    # a step used its budget or met a refusal: staff decide
    NEEDS_ATTENTION = "needs_attention", pgettext_lazy("return status", "Needs Attention")


RETURN_TRANSITIONS: dict[str | None, frozenset[str]] = {
    None: frozenset({ReturnStatus.REQUESTED}),
    ReturnStatus.REQUESTED: frozenset({ReturnStatus.PROCESSING}),
    ReturnStatus.PROCESSING: frozenset({ReturnStatus.COMPLETED, ReturnStatus.NEEDS_ATTENTION}),
    # "Retry failed steps" puts it back to processing; a late step finishing completes it.
    ReturnStatus.NEEDS_ATTENTION: frozenset({ReturnStatus.PROCESSING, ReturnStatus.COMPLETED}),
    ReturnStatus.COMPLETED: frozenset(),
}


class StepName(models.TextChoices):
    """The compensation steps (contract: the return body's `steps`); cancellations use them too."""

    RESTOCK = "restock", pgettext_lazy("compensation step", "Restock")
    REFUND = "refund", pgettext_lazy("compensation step", "Refund")
    HISTORY = "history", pgettext_lazy("compensation step", "History")
    LOYALTY = "loyalty", pgettext_lazy("compensation step", "Loyalty")
    NOTIFY = "notify", pgettext_lazy("compensation step", "Notify")


class StepStatus(models.TextChoices):
    # due now or later (not tried yet, waiting, or failed and backing off)
    PENDING = "pending", pgettext_lazy("compensation step status", "Pending")
    # an attempt was taken and has not reported (a killed one looks so too)
    RUNNING = "running", pgettext_lazy("compensation step status", "Running")
    # its effect is recorded; nothing is due
    DONE = "done", pgettext_lazy("compensation step status", "Done")
    # needs attention: budget spent or a refusal; staff "Retry failed steps"
    FAILED = "failed", pgettext_lazy("compensation step status", "Failed")


class CompensationKind(models.TextChoices):
    RETURN = "return", pgettext_lazy("compensation kind", "Return")  # a received return's steps
    # a confirmed order's cancellation
    CANCELLATION = "cancellation", pgettext_lazy("compensation kind", "Cancellation")
