"""The order's, the line's and fulfillment's state machines, as visible tables.

A status changes only along these arrows (`None` is "not yet created"), by a
conditional UPDATE that names the source status, and each change writes an
`OrderEvent` in the same transaction. Cancelling a confirmed order
(`cancelling` → `cancelled`) is driven by its compensation steps
(docs/compensation.md); returns and steps have their machines here too.
"""

from __future__ import annotations

from django.db import models


class OrderStatus(models.TextChoices):
    AWAITING_DECISION = "awaiting_decision"
    PAYMENT_PENDING = "payment_pending"
    CONFIRMED = "confirmed"
    PARTIALLY_CONFIRMED = "partially_confirmed"
    PAYMENT_FAILED = "payment_failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class LineStatus(models.TextChoices):
    RESERVED = "reserved"
    CONFIRMED = "confirmed"
    UNAVAILABLE = "unavailable"
    RELEASED = "released"
    CANCELLED = "cancelled"


class Fulfillment(models.TextChoices):
    UNFULFILLED = "unfulfilled"
    PARTIALLY_SHIPPED = "partially_shipped"
    SHIPPED = "shipped"


class OnShortage(models.TextChoices):
    REJECT = "reject"
    PARTIAL = "partial"
    ASK = "ask"


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

    LABEL_CREATED = "label_created"
    PICKED_UP = "picked_up"
    IN_TRANSIT = "in_transit"
    OUT_FOR_DELIVERY = "out_for_delivery"
    DELIVERED = "delivered"
    EXCEPTION = "exception"


class ReturnStatus(models.TextChoices):
    """A return's statuses (contract: "Returns")."""

    REQUESTED = "requested"  # the shopper asked; the units are not back yet (an open return)
    PROCESSING = "processing"  # received: its compensation steps are running
    COMPLETED = "completed"  # every step done
    NEEDS_ATTENTION = "needs_attention"  # a step used its budget or met a refusal: staff decide


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

    RESTOCK = "restock"
    REFUND = "refund"
    HISTORY = "history"
    LOYALTY = "loyalty"
    NOTIFY = "notify"


class StepStatus(models.TextChoices):
    PENDING = "pending"  # due now or later (not tried yet, waiting, or failed and backing off)
    RUNNING = "running"  # an attempt was taken and has not reported (a killed one looks so too)
    DONE = "done"  # its effect is recorded; nothing is due
    FAILED = "failed"  # needs attention: budget spent or a refusal; staff "Retry failed steps"


class CompensationKind(models.TextChoices):
    RETURN = "return"  # a received return's steps
    CANCELLATION = "cancellation"  # a confirmed order's cancellation
