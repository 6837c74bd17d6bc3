"""The events the shopper's account consumes, and how their payloads are read.

The producers (orders, returns) write these to the outbox; the relay hands
each to the consumers (`shop.loyalty.loyalty_apply`,
`shop.history.history_apply`) with the outbox message's id. The type names
are the producer's (`orders.event_types`); of orders `shop` reads the
payload only, and a payload it cannot read is a `PoisonMessage` (not
retried; the consumer task dead-letters it).
See docs/events.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal, InvalidOperation
from typing import Any

from orders.event_types import OrderEventType

# The producer owns the names (orders/event_types.py); these are the ones the
# account consumes.
ORDER_CONFIRMED = OrderEventType.CONFIRMED
ORDER_PARTIALLY_CONFIRMED = OrderEventType.PARTIALLY_CONFIRMED
ORDER_CANCELLED = OrderEventType.CANCELLED
RETURN_COMPLETED = OrderEventType.RETURN_COMPLETED

# Confirmation earns points and adds purchases; the other two take them back.
CONFIRMED_TYPES = frozenset({ORDER_CONFIRMED, ORDER_PARTIALLY_CONFIRMED})
HANDLED_TYPES = frozenset({*CONFIRMED_TYPES, ORDER_CANCELLED, RETURN_COMPLETED})


class Outcome(enum.StrEnum):
    """What applying one event did, for the account's consumers (loyalty, history).

    The e-mails consumer has outcomes of its own (`shop.emails.Outcome`): a mail
    is sent, at least once, or not sent for want of an address; never "applied".
    """

    APPLIED = "applied"
    DUPLICATE = "duplicate"
    IGNORED = "ignored"


class PoisonMessage(Exception):
    """Raise for a message that can never be applied (bad payload): dead-letter it."""

    retryable = False


class RetryableConsumerError(Exception):
    """Raise when applying failed for a passing reason: retry the message later."""

    retryable = True


@dataclass(frozen=True)
class Line:
    sku: str
    quantity: int  # quantity_confirmed for an order, quantity returned for a return
    unit_price: Decimal

    @property
    def points(self) -> int:
        """Return floor(unit_price) × quantity (the contract's earning rule)."""
        return int(self.unit_price.to_integral_value(rounding=ROUND_FLOOR)) * self.quantity


@dataclass(frozen=True)
class OrderFact:
    """What an order or return event says, as far as the shopper's account cares."""

    event_type: str
    order_id: str
    number: int
    owner_id: int
    currency: str
    lines: tuple[Line, ...]
    return_id: str | None = None


def _field(payload: dict, name: str, kinds: type | tuple[type, ...]) -> Any:
    value = payload.get(name)
    # bool is an int in Python; never accept true/false for a number.
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise PoisonMessage(f"payload field {name!r} missing or not {kinds}: {value!r}")
    return value


def _line(raw: Any, *, quantity_field: str) -> Line:
    if not isinstance(raw, dict):
        raise PoisonMessage(f"line is not an object: {raw!r}")
    sku = _field(raw, "sku", str)
    quantity = _field(raw, quantity_field, int)
    price_text = _field(raw, "unit_price", str)
    try:
        price = Decimal(price_text)
    except InvalidOperation:
        raise PoisonMessage(f"unit_price is not a decimal: {price_text!r}") from None
    if not sku or quantity < 0 or not price.is_finite() or price < 0:
        raise PoisonMessage(f"line out of range: {raw!r}")
    return Line(sku=sku, quantity=quantity, unit_price=price)


def parse(*, event_type: str, payload: Any) -> OrderFact | None:
    """Read a handled event's payload; None for a type this account ignores.

    Raise `PoisonMessage` when a handled type's payload lacks a field or a
    field has the wrong shape.
    """
    if event_type not in HANDLED_TYPES:
        return None
    if not isinstance(payload, dict):
        raise PoisonMessage(f"payload is not an object: {payload!r}")
    order_id = _field(payload, "order_id", str)
    number = _field(payload, "number", int)
    owner_id = _field(payload, "owner_id", int)
    raw_lines = _field(payload, "lines", list)
    if not order_id:
        raise PoisonMessage("payload field 'order_id' is empty")
    if event_type == RETURN_COMPLETED:
        return_id = _field(payload, "return_id", str)
        lines = tuple(_line(raw, quantity_field="quantity") for raw in raw_lines)
    else:
        return_id = None
        lines = tuple(_line(raw, quantity_field="quantity_confirmed") for raw in raw_lines)
    skus = [line.sku for line in lines]
    if len(set(skus)) != len(skus):
        raise PoisonMessage(f"a sku appears twice in the lines: {skus}")
    currency = payload.get("currency", "")
    if not isinstance(currency, str):
        raise PoisonMessage(f"payload field 'currency' is not a string: {currency!r}")
    return OrderFact(
        event_type=event_type,
        order_id=order_id,
        number=number,
        owner_id=owner_id,
        currency=currency,
        lines=lines,
        return_id=return_id,
    )
