"""Shopper e-mails: both parts, the right recipient, once per event (inbox claim first)."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.core import mail
from django.core.mail import EmailMultiAlternatives

from shop import emails
from tests.concurrency import Workers, wait_for_lock_waiters

pytestmark = pytest.mark.django_db(transaction=True)


def order_payload(user, **extra):
    payload = {
        "order_id": str(uuid.uuid4()),
        "number": 42,
        "owner_id": user.pk,
        "status": "confirmed",
        "total": "39.98",
        "currency": "EUR",
        "lines": [
            {
                "sku": "TEE-M",
                "quantity_requested": 2,
                "quantity_confirmed": 2,
                "unit_price": "19.99",
                "status": "confirmed",
            }
        ],
    }
    payload.update(extra)
    return payload


def send(event_type, payload, message_id=None):
    return emails.email_send(
        message_id=message_id or str(uuid.uuid4()), event_type=event_type, payload=payload
    ).outcome


@pytest.mark.parametrize(
    ("event_type", "extra", "needle"),
    [
        ("order.confirmed", {}, "39.98 EUR"),
        ("order.partially_confirmed", {}, "confirmed"),
        ("order.payment_failed", {"status": "payment_failed"}, "declined"),
        ("order.shipment_created", {"carrier": "DHL", "tracking_number": "TRK-777"}, "TRK-777"),
        (
            "refund.succeeded",
            {"amount": "12.50", "reference": "order-42", "refund_id": "r1"},
            "12.50 EUR",
        ),
    ],
)
def test_each_mail_has_both_parts_the_recipient_and_its_content(shopper, event_type, extra, needle):
    assert send(event_type, order_payload(shopper, **extra)) == "sent"
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert isinstance(message, EmailMultiAlternatives)
    assert message.to == [shopper.email]
    assert "42" in message.subject
    assert needle in message.body
    (html, mimetype), *_ = message.alternatives
    assert mimetype == "text/html"
    assert needle in html


def test_other_event_types_send_nothing(shopper):
    assert send("order.cancelled", order_payload(shopper)) == "ignored"
    assert mail.outbox == []


def test_the_same_event_twice_sends_one_mail(shopper):
    payload = order_payload(shopper)
    assert send("order.confirmed", payload, message_id="m-1") == "sent"
    assert send("order.confirmed", payload, message_id="m-1") == "duplicate"
    assert len(mail.outbox) == 1


def test_a_shopper_without_address_gets_no_mail(shopper):
    shopper.email = ""
    shopper.save(update_fields=["email"])
    assert send("order.confirmed", order_payload(shopper), message_id="m-2") == "no_address"
    assert mail.outbox == []


def test_a_failed_send_rolls_the_claim_back(shopper, monkeypatch):
    def boom(self, fail_silently=False):
        raise OSError("smtp down")

    monkeypatch.setattr(EmailMultiAlternatives, "send", boom)
    with pytest.raises(OSError):
        send("order.confirmed", order_payload(shopper), message_id="m-3")
    monkeypatch.undo()
    assert send("order.confirmed", order_payload(shopper), message_id="m-3") == "sent"
    assert len(mail.outbox) == 1


# --- two copies at once -----------------------------------------------------------


def wrong_send(*, message_id, event_type, payload):
    """Deliberately wrong twin: sends before claiming, so a racing copy sends too."""
    from django.db import transaction

    with transaction.atomic():
        EmailMultiAlternatives("x", "y", to=["a@example.com"]).send()
        emails.inbox_claim_many(consumer=emails.CONSUMER, message_ids=[message_id])


def race(monkeypatch, apply):
    claimed, release = threading.Event(), threading.Event()
    real_claim = emails.inbox_claim_many
    first = threading.Lock()

    def claim(**kwargs):
        result = real_claim(**kwargs)
        if first.acquire(blocking=False):
            claimed.set()
            assert release.wait(timeout=30)
        return result

    monkeypatch.setattr(emails, "inbox_claim_many", claim)
    barrier = threading.Barrier(2)

    def deliver():
        barrier.wait(timeout=30)
        return apply()

    workers = Workers()
    workers.start(deliver)
    workers.start(deliver)
    assert claimed.wait(timeout=30)
    wait_for_lock_waiters(1)  # the overlap is real: the second copy waits on the claim
    release.set()
    return workers.join()


def test_two_copies_at_once_send_one_mail(shopper, monkeypatch):
    payload = order_payload(shopper)
    outcomes = race(monkeypatch, lambda: send("order.confirmed", payload, message_id="m-race"))
    assert sorted(outcomes) == ["duplicate", "sent"]
    assert len(mail.outbox) == 1


def test_the_wrong_twin_sends_twice(shopper, monkeypatch):
    # The twin claims through emails.inbox_claim_many too, so race() holds its claim.
    race(
        monkeypatch,
        lambda: wrong_send(message_id="m-wrong", event_type="order.confirmed", payload={}),
    )
    assert len(mail.outbox) == 2
