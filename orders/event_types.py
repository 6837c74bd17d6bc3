"""The events the orders app writes to the outbox: their one owner.

Every `OutboxMessage.event_type` that orders writes (orders.services,
orders.shipments, orders.compensation) is a member here, and every consumer
(shop.events, shop.emails) imports it from here: a rename is one edit, and
tests/test_event_types.py fails when a consumer subscribes to a type no
producer writes, or a written type has no consumer and is not in
`UNCONSUMED`. The values are the stored strings: never change one without a
data migration of the outbox.
"""

from __future__ import annotations

import enum


class OrderEventType(enum.StrEnum):
    CONFIRMED = "order.confirmed"
    PARTIALLY_CONFIRMED = "order.partially_confirmed"
    PAYMENT_FAILED = "order.payment_failed"
    CANCELLED = "order.cancelled"
    EXPIRED = "order.expired"
    SHIPMENT_CREATED = "order.shipment_created"
    RETURN_COMPLETED = "return.completed"


# Written for the record (the outbox is the order's published history) though
# no consumer of this shop acts on it: an expired order earned nothing and was
# never e-mailed about, and its stock came back in the transaction that wrote it.
UNCONSUMED: frozenset[OrderEventType] = frozenset({OrderEventType.EXPIRED})
