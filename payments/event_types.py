"""The events the payments app writes to the outbox: their one owner.

Not the provider's webhook types (`payments.provider_events`: what the
provider sends us); these are what the shop publishes to its own consumers
(shop.emails). See orders/event_types.py for the rules; the values are the
stored strings.
"""

from __future__ import annotations

import enum


class PaymentEventType(enum.StrEnum):
    REFUND_SUCCEEDED = "refund.succeeded"


UNCONSUMED: frozenset[PaymentEventType] = frozenset()
