"""The provider's webhooks: verify the signature, store the event in the inbox, apply it once.

`POST /api/v1/payments/webhooks/` (payments/api/) hands the raw body and the
`Shop-Signature` header to `webhook_receive`:

1. The signature is checked first, over the raw bytes, with a constant-time
   comparison (`hmac.compare_digest`) and a 300 s timestamp window judged by
   the database clock (a host whose clock runs ahead must not refuse what the
   others accept). Bad → 400 `invalid_signature`, nothing stored.
2. The body is parsed and validated (400 `malformed_json` / `invalid_request`,
   nothing stored).
3. One transaction: the event is inserted into the inbox FIRST (consumer
   `payments.provider`, message id the event id); the unique constraint
   `idempotency_inboxmessage_consumer_message_uniq` decides — a violation of
   exactly that constraint is a duplicate (200, no effect, counted as
   `shop_duplicates_suppressed_total{mechanism="webhook"}`). Then the effect,
   and the row's `status` says what became of the event.

The effect of `charge.captured` / `charge.failed` is the SAME conditional
transition the inline capture and settlement use
(`payments.recording.capture_record`: `UPDATE … WHERE status = 'pending'`),
with the payment row locked first: whichever path records the outcome first
wins, every other one finds the payment no longer `pending` and changes
nothing. So a webhook racing settlement, the inline call or its own
duplicate makes one effect.

Refund events (`refund.succeeded` / `refund.failed`) go through the refund's
one conditional transition (`apply_refund_event`), the same one the
`payments.refund` task uses; unmatched ones are applied when the task meets
their key (`stored_refund_result`).

An event for a capture the shop does not know (no payment with the event's
reference, or no capture transaction under its provider key) is stored
`unmatched`; when the shop's capture recorder later gets no final answer
from the provider it looks for such a stored event (`stored_capture_result`)
and records it through the same transition, marking the row `applied`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.db import IntegrityError, transaction

from core.db import database_now, violated_constraint
from core.errors import ApplicationError, InvalidRequest
from idempotency import metrics
from idempotency.messaging.inbox import INBOX_CONSTRAINT, inbox_mark, inbox_payload, inbox_store

from .lock_objects import payment_lock
from .models import (
    Payment,
    PaymentStatus,
    PaymentTransaction,
    Refund,
    RefundStatus,
    TransactionKind,
)
from .provider_events import (  # noqa: F401 - the event words, named here as before
    APPLIED,
    CHARGE_CAPTURED,
    CHARGE_FAILED,
    CHARGE_TYPES,
    DUPLICATE,
    EVENT_TYPES,
    IGNORED,
    NO_EFFECT,
    REFUND_FAILED,
    REFUND_SUCCEEDED,
    REFUND_TYPES,
    SOURCE,
    SUSPICIOUS,
    UNMATCHED,
    result_of,
)
from .recording import capture_record, refund_record
from .refund_decisions import refund_late_success

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "Shop-Signature"
TOLERANCE_SECONDS = 300

_CAPTURED_STATUSES = frozenset(
    {PaymentStatus.CAPTURED, PaymentStatus.PARTIALLY_REFUNDED, PaymentStatus.REFUNDED}
)


class InvalidSignature(ApplicationError):
    status = 400
    code = "invalid_signature"
    title = "Invalid signature"


class MalformedJson(ApplicationError):
    status = 400
    code = "malformed_json"
    title = "Malformed JSON"


@dataclass(frozen=True)
class WebhookEvent:
    id: str
    type: str
    created: int
    data: dict
    raw: dict


@dataclass(frozen=True)
class WebhookOutcome:
    event_id: str
    type: str
    status: str  # one of APPLIED … DUPLICATE
    detail: str = ""


# -- signature -------------------------------------------------------------------


def sign(*, secret: str, timestamp: int, body: bytes) -> str:
    """Return a `Shop-Signature` value for `body` (tests, and the contract's recipe)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify_signature(
    *,
    header: str | None,
    body: bytes,
    secret: str,
    now: float | None = None,
    tolerance: int = TOLERANCE_SECONDS,
) -> int:
    """Check `Shop-Signature` against the raw body; return its timestamp or raise InvalidSignature.

    Format `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">`; several
    `v1` entries are allowed (a provider rotating its secret sends one per
    secret): any one matching is enough. Every comparison is constant-time.
    `now` is the clock the window is judged by: the shop passes the database
    clock (`webhook_receive`); the host clock is only the default for callers
    without a database (a test's stand-in receiver).
    """
    if not secret:
        # Never accept webhooks signed with an empty key (misconfiguration).
        raise InvalidSignature("The shop has no webhook secret configured.")
    if not header:
        raise InvalidSignature(f"The {SIGNATURE_HEADER} header is missing.")
    timestamp: int | None = None
    signatures: list[str] = []
    for part in header.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            continue
        if name == "t":
            try:
                timestamp = int(value)
            except ValueError:
                raise InvalidSignature("The signature's timestamp is not a number.") from None
        elif name == "v1":
            signatures.append(value)
    if timestamp is None or not signatures:
        raise InvalidSignature(f"The {SIGNATURE_HEADER} header has no t= or no v1= entry.")
    now = time.time() if now is None else now
    if abs(now - timestamp) > tolerance:
        raise InvalidSignature(f"The signature's timestamp is more than {tolerance} s away.")
    expected = hmac.new(
        secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256
    ).hexdigest()
    # Evaluate every candidate (no early exit) so timing says nothing about which matched.
    matched = False
    for candidate in signatures:
        matched |= hmac.compare_digest(expected.encode(), candidate.encode("utf-8", "replace"))
    if not matched:
        raise InvalidSignature("The signature does not match the body.")
    return timestamp


# -- parsing ---------------------------------------------------------------------


def _decimal_text(value, field: str) -> Decimal:
    if not isinstance(value, str):
        raise InvalidRequest("Invalid event.", errors={f"data.{field}": ["A decimal string."]})
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise InvalidRequest(
            "Invalid event.", errors={f"data.{field}": ["A decimal string."]}
        ) from None
    if not amount.is_finite() or amount <= 0:
        raise InvalidRequest("Invalid event.", errors={f"data.{field}": ["Must be positive."]})
    return amount


def parse_event(body: bytes) -> WebhookEvent:
    """Parse and validate one event body (400 `malformed_json` / `invalid_request`)."""
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise MalformedJson("The body is not JSON.") from None
    if not isinstance(raw, dict):
        raise InvalidRequest("The event must be a JSON object.", errors={"non_field_errors": []})
    errors: dict[str, list[str]] = {}
    event_id, event_type, created = raw.get("id"), raw.get("type"), raw.get("created")
    if not isinstance(event_id, str) or not 0 < len(event_id) <= 255:
        errors["id"] = ["A string of 1..255 characters."]
    if not isinstance(event_type, str) or not 0 < len(event_type) <= 100:
        errors["type"] = ["A string of 1..100 characters."]
    if isinstance(created, bool) or not isinstance(created, int):
        errors["created"] = ["Unix seconds (an integer)."]
    data = raw.get("data")
    if not isinstance(data, dict):
        errors["data"] = ["An object."]
    elif event_type in EVENT_TYPES:
        for name in ("provider_key", "reference", "currency"):
            value = data.get(name)
            if not isinstance(value, str) or not 0 < len(value) <= 255:
                errors[f"data.{name}"] = ["A string of 1..255 characters."]
        if "amount" not in data:
            errors["data.amount"] = ["This field is required."]
    if errors:
        raise InvalidRequest(
            "Invalid event: " + ", ".join(sorted(errors)) + ".",
            errors={key: value for key, value in errors.items()},
        )
    # No errors: each was checked above.
    assert isinstance(event_id, str) and isinstance(event_type, str)
    assert isinstance(created, int) and isinstance(data, dict)
    if event_type in EVENT_TYPES:
        _decimal_text(data["amount"], "amount")
    return WebhookEvent(id=event_id, type=event_type, created=created, data=data, raw=raw)


# -- receive ---------------------------------------------------------------------


def webhook_receive(*, body: bytes, signature: str | None) -> WebhookOutcome:
    """Verify, store and apply one webhook delivery (the endpoint's whole job)."""
    # The window is judged by the database clock, not this host's: by its own
    # clock a host ahead by more than the window refuses every webhook
    # (docs/failure-model.md, "What broke, and what fixed it").
    verify_signature(
        header=signature,
        body=body,
        secret=settings.PAYMENTS_WEBHOOK_SECRET,
        now=database_now().timestamp(),
    )
    event = parse_event(body)
    try:
        return _store_and_apply(event)
    except IntegrityError as exc:
        # The inbox row is the transaction's first statement: a violation of its
        # unique constraint means this event id was stored (and applied) before.
        if violated_constraint(exc) != INBOX_CONSTRAINT:
            raise
        first = inbox_payload(consumer=SOURCE, message_id=event.id)
        # The same id with another payload is not a harmless redelivery: count it apart.
        metrics.duplicate_suppressed(
            mechanism=metrics.WEBHOOK_DUPLICATE,
            suspicious=first is not None and first != event.raw,
            event_id=event.id,
            event_type=event.type,
        )
        return WebhookOutcome(event_id=event.id, type=event.type, status=DUPLICATE)


@transaction.atomic
def _store_and_apply(event: WebhookEvent) -> WebhookOutcome:
    # Insert first: a concurrent delivery of the same event waits here on our
    # uncommitted row and then fails on the constraint (or inserts, if we roll back).
    message = inbox_store(
        consumer=SOURCE,
        message_id=event.id,
        message_type=event.type,
        payload=event.raw,
        status=UNMATCHED,
    )
    if event.type in CHARGE_TYPES:
        status, detail = _apply_charge(event)
    elif event.type in REFUND_TYPES:
        status, detail = apply_refund_event(event)
    else:
        status, detail = IGNORED, f"event type {event.type!r} is not handled by this shop"
        logger.info("webhook %s: %s", event.id, detail)
    inbox_mark(row_id=message.id, status=status, detail=detail[:1000], processed=status == APPLIED)
    return WebhookOutcome(event_id=event.id, type=event.type, status=status, detail=detail)


def _capture_txn(event_data: dict) -> PaymentTransaction | None:
    """Find the shop's capture call this event speaks of (by reference, then provider key)."""
    payment_id = (
        Payment.objects.filter(reference=event_data.get("reference"))
        .values_list("id", flat=True)
        .first()
    )
    if payment_id is None:
        return None
    return PaymentTransaction.objects.filter(
        payment_id=payment_id,
        kind=TransactionKind.CAPTURE,
        provider_key=event_data.get("provider_key"),
    ).first()


def _apply_charge(event: WebhookEvent) -> tuple[str, str]:
    data = event.data
    txn = _capture_txn(data)
    if txn is None:
        detail = "no capture with this reference and provider key (yet)"
        logger.info("webhook %s (%s) stored unmatched: %s", event.id, event.type, detail)
        return UNMATCHED, detail
    payment = payment_lock(payment_id=txn.payment_id)
    if (Decimal(data["amount"]), data["currency"]) != (txn.amount, txn.currency):
        detail = (
            f"provider says {data['amount']} {data['currency']}, "
            f"shop asked {txn.amount} {txn.currency}: not applied"
        )
        logger.warning("webhook %s (%s) suspicious: %s", event.id, event.type, detail)
        return SUSPICIOUS, detail
    captured = event.type == CHARGE_CAPTURED
    if payment.status == PaymentStatus.PENDING:
        capture_record(
            transaction_id=txn.id, result=result_of(event.type, data), mode="webhook", txn=txn
        )
        return APPLIED, f"payment {payment.reference} {'captured' if captured else 'failed'}"
    if (captured and payment.status in _CAPTURED_STATUSES) or (
        not captured and payment.status == PaymentStatus.FAILED
    ):
        return NO_EFFECT, f"payment {payment.reference} was already {payment.status}"
    # The provider contradicts what the shop recorded. Never flip a recorded
    # outcome from a webhook: reconciliation and staff look at it.
    detail = f"{event.type} for payment {payment.reference}, which the shop has {payment.status}"
    logger.warning("webhook %s suspicious: %s", event.id, detail)
    return SUSPICIOUS, detail


def apply_refund_event(event: WebhookEvent) -> tuple[str, str]:
    """Apply a `refund.succeeded` / `refund.failed` event through the refund's one transition.

    The refund is found by its provider key. The effect is the SAME
    conditional transition the `payments.refund` task uses
    (`payments.recording.refund_record`): whichever records first wins, the
    other finds the refund no longer open and changes nothing. A key the
    shop does not know (yet) is stored `unmatched`; the task applies it when
    it meets the key with no final answer of its own (`stored_refund_result`).
    """
    data = event.data
    refund = Refund.objects.filter(provider_key=data.get("provider_key")).first()
    if refund is None:
        detail = "no refund with this provider key (yet)"
        logger.info("webhook %s (%s) stored unmatched: %s", event.id, event.type, detail)
        return UNMATCHED, detail
    if (Decimal(data["amount"]), data["currency"]) != (refund.amount, refund.currency):
        detail = (
            f"provider says {data['amount']} {data['currency']}, "
            f"shop asked {refund.amount} {refund.currency}: not applied"
        )
        logger.warning("webhook %s (%s) suspicious: %s", event.id, event.type, detail)
        return SUSPICIOUS, detail
    succeeded = event.type == REFUND_SUCCEEDED
    if refund_record(refund=refund, result=result_of(event.type, data), mode="webhook"):
        return APPLIED, f"refund {refund.id} {'succeeded' if succeeded else 'refused'}"
    if succeeded and refund_late_success(
        refund_id=refund.id, operation_id=str(data.get("operation_id") or ""), via="webhook"
    ):
        # Staff had decided it (outside the shop / failed): never silence, never a
        # second hole in the budget — a needs-attention item (payments.refund_decisions).
        detail = f"refund {refund.id}: {Refund.objects.get(id=refund.id).last_error}"
        logger.warning("webhook %s suspicious: %s", event.id, detail)
        return SUSPICIOUS, detail
    status = Refund.objects.values_list("status", flat=True).get(id=refund.id)
    if (succeeded and status == RefundStatus.SUCCEEDED) or (
        not succeeded and status in (RefundStatus.NEEDS_ATTENTION, RefundStatus.FAILED)
    ):
        return NO_EFFECT, f"refund {refund.id} was already {status}"
    detail = f"{event.type} for refund {refund.id}, which the shop has {status}"
    logger.warning("webhook %s suspicious: %s", event.id, detail)
    return SUSPICIOUS, detail


# -- settlement meets a stored event ------------------------------------------------
