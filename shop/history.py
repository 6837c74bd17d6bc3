"""The purchase history read model: each order and return event applied once, through the inbox.

`history_apply` claims the message id in the inbox and makes its effect in
one transaction: the id is recorded before the effect (a concurrent copy
waits on the uncommitted claim, then sees it and skips), and a crash undoes
both together. Each row keeps its parts (confirmed, returned, cancelled) and
the net figures the API shows are recomputed from them, so events arriving
out of order (a return before its confirmation) net to the same result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection, transaction

from idempotency.messaging.deliveries import Message
from idempotency.messaging.inbox import inbox_claim, inbox_claim_many

from . import events
from .events import Outcome
from .models import PurchaseHistoryLine

CONSUMER = "purchase_history"


@dataclass(frozen=True)
class HistoryResult:
    outcome: Outcome


# One row per (order, sku); on a second event only the part it carries moves.
_UPSERT = (
    "INSERT INTO shop_purchasehistoryline AS t (user_id, order_id, order_number, position, sku, "
    "unit_price, currency, quantity_confirmed, quantity_returned, cancelled, quantity, amount, "
    "created_at) VALUES (%(user_id)s, %(order_id)s, %(number)s, %(position)s, %(sku)s, "
    "%(unit_price)s, %(currency)s, %(confirmed)s, %(returned)s, %(cancelled)s, 0, 0, now()) "
    "ON CONFLICT (order_id, sku) DO UPDATE SET {update}"
)
_ON_CONFIRMED = (
    "quantity_confirmed = EXCLUDED.quantity_confirmed, position = EXCLUDED.position, "
    "unit_price = EXCLUDED.unit_price, currency = EXCLUDED.currency"
)
_ON_RETURNED = "quantity_returned = t.quantity_returned + EXCLUDED.quantity_returned"
_ON_CANCELLED = "cancelled = true"

# The batch's rows of one kind in one statement, in (order, sku) order: the lock order of
# every writer. `{update}` is the kind's part, as for one event.
_UPSERT_MANY = (
    "INSERT INTO shop_purchasehistoryline AS t (user_id, order_id, order_number, position, sku, "
    "unit_price, currency, quantity_confirmed, quantity_returned, cancelled, quantity, amount, "
    "created_at) SELECT u.*, 0, 0, now() FROM unnest(%s::bigint[], %s::text[], %s::bigint[], "
    "%s::int[], %s::text[], %s::numeric[], %s::text[], %s::int[], %s::int[], %s::boolean[]) "
    "AS u ORDER BY 2, 5 ON CONFLICT (order_id, sku) DO UPDATE SET {update}"
)

_NET = (
    "UPDATE shop_purchasehistoryline SET "
    "quantity = CASE WHEN cancelled THEN 0 "
    "  ELSE GREATEST(quantity_confirmed - quantity_returned, 0) END, "
    "amount = unit_price * CASE WHEN cancelled THEN 0 "
    "  ELSE GREATEST(quantity_confirmed - quantity_returned, 0) END "
    "WHERE order_id = ANY(%s::text[])"
)


def _upsert(fact: events.OrderFact, update: str, *, confirmed: bool, returned: bool) -> None:
    cancelled = fact.event_type == events.ORDER_CANCELLED
    rows: list[dict[str, Any]] = [
        {
            "user_id": fact.owner_id,
            "order_id": fact.order_id,
            "number": fact.number,
            "position": position,
            "sku": line.sku,
            "unit_price": line.unit_price,
            "currency": fact.currency,
            "confirmed": line.quantity if confirmed else 0,
            "returned": line.quantity if returned else 0,
            "cancelled": cancelled,
        }
        for position, line in enumerate(fact.lines)
        # A confirmed line with nothing confirmed (unavailable) is no purchase.
        if not confirmed or line.quantity > 0
    ]
    # Rows locked in sku order: two transactions writing one order's lines wait, never deadlock.
    rows.sort(key=lambda row: row["sku"])
    if rows:
        with connection.cursor() as cursor:
            cursor.executemany(_UPSERT.format(update=update), rows)


def _check_id(message_id: Any) -> None:
    if not isinstance(message_id, str) or not message_id or len(message_id) > 255:
        raise events.PoisonMessage(f"message id must be a non-empty string: {message_id!r}")


def _effect(fact: events.OrderFact) -> None:
    """Make one claimed event's effect on the order's rows, then recompute their net."""
    if fact.event_type in events.CONFIRMED_TYPES:
        _upsert(fact, _ON_CONFIRMED, confirmed=True, returned=False)
    elif fact.event_type == events.RETURN_COMPLETED:
        _upsert(fact, _ON_RETURNED, confirmed=False, returned=True)
    else:
        # Rows for every line, so that a confirmation arriving after its
        # cancellation (out of order) finds the order already cancelled.
        _upsert(fact, _ON_CANCELLED, confirmed=False, returned=False)
        PurchaseHistoryLine.objects.filter(order_id=fact.order_id).update(cancelled=True)
    with connection.cursor() as cursor:
        cursor.execute(_NET, [[fact.order_id]])


@transaction.atomic
def history_apply(*, message_id: str, event_type: str, payload: dict) -> HistoryResult:
    """Apply one order or return event to its shopper's purchase history, once per message id.

    Return `applied`, `duplicate` (the inbox has this id for this consumer;
    counted there) or `ignored` (a type the history does not show). Raise
    `PoisonMessage` for a payload that cannot be read (nothing is recorded).
    """
    _check_id(message_id)
    fact = events.parse(event_type=event_type, payload=payload)
    if fact is None:
        return HistoryResult(Outcome.IGNORED)
    if not get_user_model().objects.filter(pk=fact.owner_id).exists():
        # Shoppers are anonymised, never deleted: an unknown owner is a bad message.
        raise events.PoisonMessage(f"owner {fact.owner_id} is not a user of this shop")
    if not inbox_claim(consumer=CONSUMER, message_id=message_id):
        return HistoryResult(Outcome.DUPLICATE)
    _effect(fact)
    return HistoryResult(Outcome.APPLIED)


def history_apply_many(messages: Sequence[Message]) -> list[HistoryResult]:
    """Apply a batch of events in the caller's transaction: `history_apply` for many at once.

    One query checks the owners, one statement claims every id in the inbox
    (`inbox_claim_many`), then the claimed events make their effects in one
    statement per kind and one net (`_effects`; rows locked in (order, sku)
    order by every batch). No savepoint per
    message: a poison message raises, the whole batch rolls back, and the
    caller (`idempotency.messaging.deliveries.deliveries_consume`) applies it one by one.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("history_apply_many must run inside the batch's transaction")
    facts: list[events.OrderFact | None] = []
    for message in messages:
        _check_id(message.message_id)
        facts.append(events.parse(event_type=message.event_type, payload=message.payload))
    owners = {fact.owner_id for fact in facts if fact is not None}
    known = set(get_user_model().objects.filter(pk__in=owners).values_list("pk", flat=True))
    for fact in facts:
        if fact is not None and fact.owner_id not in known:
            raise events.PoisonMessage(f"owner {fact.owner_id} is not a user of this shop")
    claimed = inbox_claim_many(
        consumer=CONSUMER,
        message_ids=[m.message_id for m, fact in zip(messages, facts, strict=True) if fact],
    )
    results = [
        HistoryResult(
            Outcome.IGNORED
            if fact is None
            else Outcome.APPLIED
            if message.message_id in claimed
            else Outcome.DUPLICATE
        )
        for message, fact in zip(messages, facts, strict=True)
    ]
    applied = [
        fact
        for fact, result in zip(facts, results, strict=True)
        if fact is not None and result.outcome == Outcome.APPLIED
    ]
    _effects(applied)
    return results


_Row = tuple[int, str, int, int, str, Any, str, int, int, bool]


def _effects(facts: list[events.OrderFact]) -> None:
    """Make the claimed events' effects, the batch's in a few statements whatever its size.

    One upsert per kind that the batch holds (confirmations set their part, returns
    add theirs, cancellations mark every line of their orders), then one net of
    every order touched: the parts commute, so the kinds' order does not matter
    (docs/events.md, "Purchase history").
    """
    if not facts:
        return
    confirmed: dict[tuple[str, str], _Row] = {}
    returned: dict[tuple[str, str], _Row] = {}
    cancelled: dict[tuple[str, str], _Row] = {}
    for fact in facts:
        is_confirmed = fact.event_type in events.CONFIRMED_TYPES
        is_returned = fact.event_type == events.RETURN_COMPLETED
        for position, line in enumerate(fact.lines):
            key = (fact.order_id, line.sku)
            if is_confirmed and line.quantity <= 0:
                continue  # a confirmed line with nothing confirmed is no purchase
            row: _Row = (
                fact.owner_id,
                fact.order_id,
                fact.number,
                position,
                line.sku,
                line.unit_price,
                fact.currency,
                line.quantity if is_confirmed else 0,
                line.quantity if is_returned else 0,
                not (is_confirmed or is_returned),
            )
            if is_confirmed:
                confirmed[key] = row
            elif is_returned:
                before = returned.get(key)
                returned[key] = row if before is None else (*before[:8], before[8] + row[8], False)
            else:
                cancelled[key] = row
    with connection.cursor() as cursor:
        for rows, update in (
            (confirmed, _ON_CONFIRMED),
            (returned, _ON_RETURNED),
            (cancelled, _ON_CANCELLED),
        ):
            if rows:
                columns = list(zip(*(rows[key] for key in sorted(rows)), strict=True))
                cursor.execute(_UPSERT_MANY.format(update=update), [list(c) for c in columns])
        if cancelled:
            # Every line of a cancelled order, also those no event of this batch named.
            cursor.execute(
                "UPDATE shop_purchasehistoryline SET cancelled = true"
                " WHERE order_id = ANY(%s::text[]) AND NOT cancelled",
                [sorted({order_id for order_id, _ in cancelled})],
            )
        cursor.execute(_NET, [sorted({fact.order_id for fact in facts})])


def history_for_user(*, user):
    """Return the shopper's purchases still held (net quantity above 0), newest order first."""
    return PurchaseHistoryLine.objects.filter(user_id=user.pk, quantity__gt=0).order_by(
        "-order_number", "position", "sku"
    )
