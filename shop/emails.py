"""Shopper e-mails: "order confirmed", "payment declined", "shipped", "refunded", one per event.

Two steps, so that no mail is sent while a delivery waits (docs/events.md,
"Shopper e-mails"):

1. **write** (the consumer "emails", batched like loyalty and history):
   `email_apply_many` runs in the batch's transaction. It reads every owner
   in one query, claims every message id in the inbox in one statement
   (`inbox_claim_many`, insert first) and writes one `Mail` row per claimed
   event in one statement (`INSERT ... ON CONFLICT ON CONSTRAINT
   shop_mail_message_uniq DO NOTHING`): a copy of the event can write no
   second row. A poison message (unreadable payload, an owner who is no user
   of the shop) raises: the batch rolls back whole and is applied one by one
   (`email_apply`), the poison message alone becomes a dead letter. After the
   commit one bell rings `shop.send_mail` for the rows written (on_commit:
   only sooner; the sweeper `shop.sweep_mail` finds them anyway).
2. **send** (due work, `core.due`): `mails_send` takes the attempts of the
   task's rows in one statement (`attempts_begin`: one runner per row, the
   row at position k leased for k sends' worst case, judged by the database
   clock), renders both parts, sends over one connection, each send within
   its total deadline (`core.mail`: the lease covers the sends before and
   this one, however slowly a live server answers), and marks the rows sent
   done in one statement (`attempts_done`). **At least once**: a crash
   between a send and the mark leaves the row due once its lease runs out,
   and it is sent again (the promise `notify` makes). A failing send
   records its error and is due again after the backoff; past its budget the
   row needs attention (the admin's "Needs attention" page, "Retry now").
"""

from __future__ import annotations

import enum
import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from celery import current_app
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMultiAlternatives, get_connection
from django.db import connection, transaction
from django.template.loader import render_to_string
from django.utils import translation
from django.utils.translation import gettext_lazy

from core import due
from core.db import delete_in_batches
from core.mail import send_deadline
from core.money import display_money
from idempotency.failpoints import failpoint
from idempotency.messaging.deliveries import Message
from idempotency.messaging.inbox import inbox_claim_many
from orders import selectors as order_selectors
from orders.event_types import OrderEventType
from payments.event_types import PaymentEventType

from . import events
from .models import Mail

logger = logging.getLogger(__name__)

CONSUMER = "emails"
SEND_TASK = "shop.send_mail"  # Mail.due_policy().task
MAIL_CONSTRAINT = "shop_mail_message_uniq"

# event type → template name (shop/templates/shop/email/<name>.txt / .html) and subject.
# The types are the producers' (orders/event_types.py, payments/event_types.py).
MAILS: dict[str, tuple[str, Any]] = {
    OrderEventType.CONFIRMED: ("order_confirmed", gettext_lazy("Your order {number} is confirmed")),
    OrderEventType.PARTIALLY_CONFIRMED: (
        "order_confirmed",
        gettext_lazy("Your order {number} is confirmed"),
    ),
    OrderEventType.PAYMENT_FAILED: (
        "payment_declined",
        gettext_lazy("Payment for order {number} was declined"),
    ),
    OrderEventType.SHIPMENT_CREATED: ("shipped", gettext_lazy("Your order {number} has shipped")),
    PaymentEventType.REFUND_SUCCEEDED: ("refunded", gettext_lazy("Your refund for order {number}")),
}
EVENT_TYPES = frozenset(MAILS)


class Outcome(enum.StrEnum):
    """What the consumer did with one event (the mail itself is sent later, by `mails_send`)."""

    QUEUED = "queued"  # a mail row written, to be sent
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


def _owner_id(message_id: Any, payload: Any) -> int | None:
    """Return the event's owner id (None: no shopper); raise PoisonMessage when unreadable."""
    if not isinstance(payload, dict) or not isinstance(message_id, str) or not message_id:
        raise events.PoisonMessage(f"unreadable e-mail event {message_id!r}")
    if len(message_id) > 255:
        raise events.PoisonMessage(f"message id too long: {message_id[:40]!r}...")
    owner_id = payload.get("owner_id")
    # bool is an int in Python; never accept true/false for an id.
    if owner_id is not None and (not isinstance(owner_id, int) or isinstance(owner_id, bool)):
        raise events.PoisonMessage(f"owner_id is not an integer: {owner_id!r}")
    return owner_id


# One statement for the batch's rows; the constraint refuses a copy's (no savepoint).
_WRITE = (
    "INSERT INTO shop_mail (message_id, event_type, payload, user_id, address)"
    " SELECT m, t, p::jsonb, u, a"
    " FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[], %s::text[])"
    " AS x(m, t, p, u, a)"
    f" ON CONFLICT ON CONSTRAINT {MAIL_CONSTRAINT} DO NOTHING RETURNING id, message_id"
)


def _write(items: Sequence[tuple[Any, str, Any]]) -> list[EmailResult]:
    """Claim and write the mails of (message id, event type, payload) items, in the caller's
    transaction; one result per item, in order."""
    handled = [(i, m, t, p) for i, (m, t, p) in enumerate(items) if t in MAILS]
    owners = {i: _owner_id(m, p) for i, m, _, p in handled}
    wanted = {o for o in owners.values() if o is not None}
    addresses = dict(
        get_user_model().objects.filter(pk__in=wanted).values_list("pk", "email") if wanted else []
    )
    unknown = wanted - set(addresses)
    if unknown:
        # Shoppers are anonymised, never deleted: an unknown owner is a bad message.
        raise events.PoisonMessage(f"owner {min(unknown)} is not a user of this shop")
    claimed = inbox_claim_many(consumer=CONSUMER, message_ids=[m for _, m, _, _ in handled])
    results = [EmailResult(Outcome.IGNORED) for _ in items]
    rows = []
    for i, message_id, event_type, payload in handled:
        if message_id not in claimed:
            results[i] = EmailResult(Outcome.DUPLICATE)
            continue
        owner = owners[i]
        address = (addresses.get(owner, "") or "").strip() if owner is not None else ""
        if not address:
            # No shopper (a payment without owner) or an anonymised one: nothing to send.
            results[i] = EmailResult(Outcome.NO_ADDRESS)
            continue
        rows.append((i, message_id, event_type, json.dumps(payload), owner, address))
    written: list[int] = []
    if rows:
        with connection.cursor() as cursor:
            cursor.execute(_WRITE, [[r[k] for r in rows] for k in range(1, 6)])
            created = {message_id: pk for pk, message_id in cursor.fetchall()}
        for i, message_id, *_ in rows:
            # Not written: a mail row of this message exists already (its inbox row
            # purged, say): the constraint decided, no second mail.
            queued = message_id in created
            results[i] = EmailResult(Outcome.QUEUED if queued else Outcome.DUPLICATE)
        written = sorted(created.values())
    # Leased for the ring in this transaction, as a sweep leases: no sweep rings them again
    # while the ring waits in the queue (core.due.lease_for_ring).
    ring_owner = due.lease_for_ring(Mail, written)
    if ring_owner is not None:
        transaction.on_commit(lambda: mails_ring(written, leased_by=ring_owner))
    return results


def email_apply_many(messages: Sequence[Message]) -> list[EmailResult]:
    """Write the mails of a batch of events in the caller's (the batch's) transaction.

    One query for the owners, one inbox claim, one insert of the mail rows;
    no savepoint: a poison message raises, the batch rolls back whole and the
    caller (`idempotency.messaging.deliveries.deliveries_consume`) applies it one by one.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("email_apply_many must run inside the batch's transaction")
    return _write([(m.message_id, m.event_type, m.payload) for m in messages])


@transaction.atomic(savepoint=False)
def email_apply(*, message_id: str, event_type: str, payload: dict) -> EmailResult:
    """Write the shopper's mail for one event, once per message id (inbox claim first)."""
    (result,) = _write([(message_id, event_type, payload)])
    return result


# -- sending -------------------------------------------------------------------------


def mails_ring(mail_ids: Sequence[int], *, leased_by: str | None = None) -> None:
    """Ring `shop.send_mail` for the rows, SHOP_MAIL_SEND_BATCH ids a message (best effort).

    The rows are the truth: a lost or refused message costs time only; the
    sweeper rings for every due row. A ring that fails frees the lease
    `leased_by` took for it, so the next sweep rings the rows.
    """
    step = max(1, settings.SHOP_MAIL_SEND_BATCH)
    ids = list(mail_ids)
    name = SEND_TASK
    try:
        for start in range(0, len(ids), step):
            current_app.send_task(name, args=[ids[start : start + step]], retry=False)
    except Exception:  # noqa: BLE001 - a broker outage must not fail recorded work
        logger.warning("could not ring %s for %d mails; the sweeper will", name, len(ids))
        due.release_ring_lease(Mail, ids, owner=leased_by)


def mails_sweep(*, limit: int) -> list[int]:
    """Lease due mail rows (database clock) and ring for them in batches: the beat sweeper.

    Like every sweep it tops its queue up to `limit` waiting messages
    (`core.due.sweep_room`); a mail ring carries a batch, so this counts
    conservatively.
    """
    room = due.sweep_room(SEND_TASK, limit=limit)
    if room == 0:
        return []
    ids = due.lease_due(Mail, limit=room)
    if ids:
        mails_ring(ids)
    return ids


class Sent(enum.StrEnum):
    SENT = "sent"
    FAILED = "failed"  # recorded; due again after the backoff
    ATTENTION = "needs_attention"  # the budget is spent: staff decide
    SKIPPED = "skipped"  # not due, another runner's attempt, done, or no such row
    LEFT = "left"  # not tried: the task's time budget ran out (still due; the sweeper rings)


@dataclass
class SendResult:
    results: dict[int, Sent]

    def summary(self) -> str:
        counts = Counter(str(r) for r in self.results.values())
        return ",".join(f"{name}:{n}" for name, n in sorted(counts.items()))


def _money(payload: dict, key: str) -> str:
    """The payload's decimal string in words for people ("€39.98"); as sent if unreadable."""
    value, currency = payload.get(key), payload.get("currency")
    try:
        return display_money(Decimal(str(value)), str(currency))
    except (InvalidOperation, ValueError):
        return f"{value} {currency}"


def _order_number(payload: dict) -> int | None:
    try:
        return int(_number(payload))
    except (TypeError, ValueError):
        return None


def mail_languages(mails: Sequence[Mail]) -> dict[int, str]:
    """The language of each mail (by mail id): its order's, in one query; LANGUAGE_CODE else."""
    numbers = {m.pk: _order_number(m.payload) for m in mails if isinstance(m.payload, dict)}
    placed = order_selectors.order_languages(numbers={n for n in numbers.values() if n})
    return {m.pk: placed.get(numbers.get(m.pk) or 0, settings.LANGUAGE_CODE) for m in mails}


def mail_message(
    mail: Mail, *, connection=None, language: str | None = None
) -> EmailMultiAlternatives:
    """Render the mail row's two parts (plain text and HTML) as a message to its address.

    A mail is written in the language its order was placed in (`language`, else
    looked up: `mail_languages`; docs/storefront.md, "Languages").
    """
    template, subject = MAILS[mail.event_type]
    payload = mail.payload if isinstance(mail.payload, dict) else {}
    if language is None:
        language = mail_languages([mail])[mail.pk]
    with translation.override(language):
        context = {
            "user": mail.user,
            "payload": payload,
            "number": _number(payload),
            "total": _money(payload, "total"),
            "amount": _money(payload, "amount"),
        }
        message = EmailMultiAlternatives(
            subject=str(subject).format(number=context["number"]),
            body=render_to_string(f"shop/email/{template}.txt", context),
            from_email=settings.DEFAULT_FROM_EMAIL,
            to=[mail.address],
            connection=connection,
        )
        message.attach_alternative(
            render_to_string(f"shop/email/{template}.html", context), "text/html"
        )
    return message


def send_budget() -> float:
    """Seconds a sender task may keep beginning attempts: its soft time limit less one send.

    A send begun before the budget ends finishes (or times out) before the soft
    limit; the rows not begun stay due and the sweeper rings for them.
    """
    limit = float(settings.CELERY_TASK_SOFT_TIME_LIMIT)
    return max(1.0, limit - Mail.due_policy().attempt_lease_seconds)


def mails_send(*, mail_ids: Sequence[int]) -> SendResult:
    """Send the mail rows `mail_ids` that are due, each one attempt, over one connection.

    The ring's attempts begin in one statement (`core.due.attempts_begin`,
    committed before any send: one runner per row, the row at position k
    leased for k sends' worst case, at most the task's soft time limit), and
    the rows sent are marked done in one statement at the end
    (`attempts_done`, fenced by each attempt). Per row: render, open and send
    within the send's total deadline `EMAIL_SEND_DEADLINE`, failpoint
    `mail.sent`. A failed send records its error (`attempt_failed`) and, past
    the budget, the row needs attention; the connection is opened again for
    the next row. No send begins after `send_budget()`: those rows' attempts
    are given back (`attempts_give_back`) and the next sweep rings them.
    **At least once**: a crash between a send and the ring's mark leaves the
    rows sent so far due once their leases run out, and they are sent again.
    """
    result = SendResult(results={})
    wanted = list(dict.fromkeys(mail_ids))
    policy = Mail.due_policy()
    begun = due.attempts_begin(
        Mail, pks=wanted, lease_cap=send_budget() + policy.attempt_lease_seconds
    )
    if len(begun) < len(wanted):
        spent = set(due.attempts_spent(Mail, pks=[pk for pk in wanted if pk not in begun]))
        for mail_id in wanted:
            if mail_id in begun:
                continue
            if mail_id in spent:
                due.flag_attention(
                    Mail,
                    pk=mail_id,
                    reason=f"not sent after {policy.max_attempts} attempts",
                    only_if_attempts_at_least=policy.max_attempts,
                )
                result.results[mail_id] = Sent.ATTENTION
            else:
                result.results[mail_id] = Sent.SKIPPED
    mails = Mail.objects.select_related("user").in_bulk(list(begun))
    languages = mail_languages(list(mails.values()))
    sent: list[due.Attempt] = []
    left: list[due.Attempt] = []
    mail_connection = get_connection(fail_silently=False)
    opened = False
    tried = False
    deadline = time.monotonic() + send_budget()
    try:
        for mail_id, attempt in begun.items():
            if tried and time.monotonic() > deadline:
                left.append(attempt)
                result.results[mail_id] = Sent.LEFT
                continue
            tried = True
            try:
                message = mail_message(
                    mails[mail_id], connection=mail_connection, language=languages[mail_id]
                )
                # Opening and sending within the send's total deadline: the attempt's
                # lease (Mail.due_policy) covers them whatever the server's pace.
                with send_deadline(mail_connection):
                    if not opened:
                        mail_connection.open()
                        opened = True
                    message.send()
            except SoftTimeLimitExceeded:
                # The task must end now: what was sent is marked, the rest's attempts
                # are given back (this one's lease makes it due again).
                due.attempts_done(Mail, attempts=sent)
                due.attempts_give_back(
                    Mail,
                    attempts=[
                        a
                        for pk, a in begun.items()
                        if pk != mail_id and result.results.get(pk) in (None, Sent.LEFT)
                    ],
                )
                raise
            except Exception as exc:  # noqa: BLE001 - every failure ends in the row
                if opened:
                    mail_connection.close()  # a broken connection is not reused
                    opened = False
                ended = due.attempt_failed(
                    Mail, pk=mail_id, error=f"{type(exc).__name__}: {exc}", attempt=attempt
                )
                logger.warning("mail %s not sent (%s): %s", mail_id, ended.value, exc)
                result.results[mail_id] = Sent.ATTENTION if ended else Sent.FAILED
                continue
            # Sent: a crash from here to the ring's mark sends it again (at least once).
            failpoint("mail.sent")
            sent.append(attempt)
            result.results[mail_id] = Sent.SENT
    finally:
        if opened:
            mail_connection.close()
    due.attempts_done(Mail, attempts=sent)
    due.attempts_give_back(Mail, attempts=left)
    return result


@transaction.atomic
def mail_retry_now(*, mail_id: int) -> bool:
    """Staff: give a mail that needs attention a fresh budget, due now; ring after commit."""
    return due.retry_now(Mail, pk=mail_id)


def mails_purge(*, batch: int | None = None, max_batches: int | None = None) -> int:
    """Delete sent mails older than SHOP_MAIL_RETENTION, in bounded batches; return how many.

    Only sent rows go (`done_at` set): a pending row is still work and a row that
    needs attention waits for staff. Each batch is its own short transaction and
    skips rows a sender holds. The retention is at least the outbox's: a copy of an
    event can only arrive while its outbox message exists, and until then the
    mail row's unique message id refuses it.
    """
    batch = batch or settings.SHOP_MAIL_PURGE_BATCH
    max_batches = max_batches or settings.SHOP_MAIL_PURGE_MAX_BATCHES
    return delete_in_batches(
        "WITH old AS (SELECT id FROM shop_mail"
        " WHERE done_at < now() - make_interval(secs => %s)"
        " ORDER BY done_at LIMIT %s FOR UPDATE SKIP LOCKED)"
        " DELETE FROM shop_mail m USING old WHERE m.id = old.id",
        [float(settings.SHOP_MAIL_RETENTION)],
        batch=batch,
        max_batches=max_batches,
    )
