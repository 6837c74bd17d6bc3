"""Shopper e-mails: "order confirmed", "payment declined", "shipped", "refunded", one per event.

`email_send` claims the message id in the inbox (consumer "emails") FIRST,
then sends, in one transaction per message: a concurrent copy waits on the
uncommitted claim and then skips; a copy after the commit is a counted
duplicate. Never run inside a multi-message batch transaction: a rollback
there would undo the claims of mails already sent and send them again (the
task runs a ring's messages one after another, each in its own transaction:
`deliveries_consume(apply_many=None)`). A crash between the send and the
commit undoes the claim: the redelivery sends again (at least once, like
`notify`).

Round trips per mail, since the task runs one transaction per message: the
claim is one `INSERT ... ON CONFLICT DO NOTHING` (`inbox_claim_many`, no
savepoint), and `email_send` joins the caller's transaction without a
savepoint of its own (an exception rolls the whole per-message transaction
back anyway).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMultiAlternatives
from django.db import transaction
from django.template.loader import render_to_string

from idempotency.inbox import inbox_claim_many
from orders.event_types import OrderEventType
from payments.event_types import PaymentEventType

from . import events

CONSUMER = "emails"

# event type → template name (shop/templates/shop/email/<name>.txt / .html) and subject.
# The types are the producers' (orders/event_types.py, payments/event_types.py).
MAILS: dict[str, tuple[str, str]] = {
    OrderEventType.CONFIRMED: ("order_confirmed", "Your order {number} is confirmed"),
    OrderEventType.PARTIALLY_CONFIRMED: ("order_confirmed", "Your order {number} is confirmed"),
    OrderEventType.PAYMENT_FAILED: ("payment_declined", "Payment for order {number} was declined"),
    OrderEventType.SHIPMENT_CREATED: ("shipped", "Your order {number} has shipped"),
    PaymentEventType.REFUND_SUCCEEDED: ("refunded", "Your refund for order {number}"),
}
EVENT_TYPES = frozenset(MAILS)


class Outcome(enum.StrEnum):
    SENT = "sent"
    DUPLICATE = "duplicate"
    IGNORED = "ignored"
    NO_ADDRESS = "no_address"


@dataclass(frozen=True)
class EmailResult:
    outcome: Outcome


def _number(payload: dict) -> Any:
    number = payload.get("number")
    if number is None and str(payload.get("reference", "")).startswith("order-"):
        number = str(payload["reference"])[len("order-") :]
    return number


@transaction.atomic(savepoint=False)
def email_send(*, message_id: str, event_type: str, payload: dict) -> EmailResult:
    """Send the shopper's mail for one event, once per message id (inbox claim first)."""
    if event_type not in MAILS:
        return EmailResult(Outcome.IGNORED)
    if not isinstance(payload, dict) or not isinstance(message_id, str) or not message_id:
        raise events.PoisonMessage(f"unreadable e-mail event {message_id!r}")
    owner_id = payload.get("owner_id")
    user = None if owner_id is None else get_user_model().objects.filter(pk=owner_id).first()
    if owner_id is not None and user is None:
        raise events.PoisonMessage(f"owner {owner_id} is not a user of this shop")
    if message_id not in inbox_claim_many(consumer=CONSUMER, message_ids=[message_id]):
        return EmailResult(Outcome.DUPLICATE)
    address = (getattr(user, "email", "") or "").strip()
    if not address:
        # No shopper (a payment without owner) or an anonymised one: nothing to send.
        return EmailResult(Outcome.NO_ADDRESS)
    template, subject = MAILS[event_type]
    context = {"user": user, "payload": payload, "number": _number(payload)}
    message = EmailMultiAlternatives(
        subject=subject.format(number=context["number"]),
        body=render_to_string(f"shop/email/{template}.txt", context),
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[address],
    )
    message.attach_alternative(
        render_to_string(f"shop/email/{template}.html", context), "text/html"
    )
    # Sent inside the transaction, after the claim: a failed send rolls the claim back.
    message.send()
    return EmailResult(Outcome.SENT)
