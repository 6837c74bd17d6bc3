"""The provider's events as the shop reads them: their types, their inbox states, their answers.

One place for what the webhook endpoint (`payments.webhooks`) stores and what
the recorder (`payments.recording`: for the inline call, settlement, the
refund task) takes from it: a stored `unmatched` event for a call's provider
key is that call's answer. Imports neither of them: the webhooks import the
recorder, never the reverse (tests/test_layout.py finds import cycles).
"""

from __future__ import annotations

import logging
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

from idempotency.messaging.inbox import inbox_locked, inbox_mark

from .gateway import Outcome, ProviderResult
from .models import PaymentTransaction, Refund

if TYPE_CHECKING:  # an annotation only: the inbox is written through idempotency.messaging.inbox
    from idempotency.models import InboxMessage

logger = logging.getLogger("payments.webhooks")

SOURCE = "payments.provider"  # the inbox consumer of the provider's webhooks

CHARGE_CAPTURED = "charge.captured"
CHARGE_FAILED = "charge.failed"
REFUND_SUCCEEDED = "refund.succeeded"
REFUND_FAILED = "refund.failed"
CHARGE_TYPES = frozenset({CHARGE_CAPTURED, CHARGE_FAILED})
REFUND_TYPES = frozenset({REFUND_SUCCEEDED, REFUND_FAILED})
EVENT_TYPES = CHARGE_TYPES | REFUND_TYPES

# What became of a stored event (InboxMessage.status).
APPLIED = "applied"  # this event recorded the outcome
NO_EFFECT = "no_effect"  # the shop had recorded the same outcome already (another path won)
UNMATCHED = "unmatched"  # the shop does not know the operation (yet); applied when met
IGNORED = "ignored"  # a type this shop does not handle
SUSPICIOUS = "suspicious"  # contradicts what the shop recorded, or other amount/currency
DUPLICATE = "duplicate"  # not stored: the same event id was stored before


def result_of(event_type: str, data: dict) -> ProviderResult:
    """The event as the provider's answer about the call under its key (capture or refund)."""
    succeeded = event_type in (CHARGE_CAPTURED, REFUND_SUCCEEDED)
    return ProviderResult(
        outcome=Outcome.SUCCEEDED if succeeded else Outcome.DECLINED,
        key=data["provider_key"],
        operation={
            "id": str(data.get("operation_id") or "")[:64],
            "key": data["provider_key"],
            "status": "succeeded" if succeeded else "declined",
            "amount": data["amount"],
            "currency": data["currency"],
        },
        code="webhook",
        detail=event_type,
    )


def _stored_event(
    *, types: frozenset, provider_key: str, amount: Decimal, currency: str, what: str
) -> InboxMessage | None:
    """Take the first stored `unmatched` event of `types` for `provider_key`; or None.

    Called by a recorder holding its row lock, with no final answer of its
    own. The event is marked `applied` in the caller's transaction (if the
    caller's record rolls back, so does the mark); events with another
    amount or currency are marked `suspicious` and skipped.
    """
    rows = inbox_locked(
        consumer=SOURCE,
        status=UNMATCHED,
        message_types=types,
        payload_lookup={"data__provider_key": provider_key},
    )
    for row in rows:
        data = row.payload.get("data") or {}
        try:
            same = (Decimal(data.get("amount", "")), data.get("currency")) == (amount, currency)
        except (InvalidOperation, TypeError):
            same = False
        if not same:
            inbox_mark(
                row_id=row.id,
                status=SUSPICIOUS,
                detail=f"amount/currency differ from the shop's {what} {amount} "
                f"{currency}: not applied",
            )
            logger.warning("stored webhook %s suspicious: other amount/currency", row.message_id)
            continue
        inbox_mark(
            row_id=row.id,
            status=APPLIED,
            detail=f"applied when the shop's {what} met it",
            processed=True,
        )
        return row
    return None


def stored_capture_result(*, txn: PaymentTransaction) -> ProviderResult | None:
    """A stored `unmatched` charge event for this capture call, as a provider answer; or None."""
    row = _stored_event(
        types=CHARGE_TYPES,
        provider_key=txn.provider_key,
        amount=txn.amount,
        currency=txn.currency,
        what="capture",
    )
    return None if row is None else result_of(row.message_type, row.payload.get("data") or {})


def stored_refund_result(*, refund: Refund) -> ProviderResult | None:
    """A stored `unmatched` refund event for this refund's key, as a provider answer; or None."""
    row = _stored_event(
        types=REFUND_TYPES,
        provider_key=refund.provider_key,
        amount=refund.amount,
        currency=refund.currency,
        what="refund",
    )
    if row is None:
        return None
    return result_of(row.message_type, row.payload.get("data") or {})
