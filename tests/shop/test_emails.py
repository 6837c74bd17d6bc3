"""Shopper e-mails: a mail row once per event (inbox claim first), then sent as due work.

The consumer's half (`email_apply`, `email_apply_many`) writes rows; the
sender's half (`mails_send`) sends them, at least once. The batch path and
its poison messages are in tests/shop/test_consumer_batches.py.
"""

from __future__ import annotations

import datetime
import threading
import uuid

import pytest
from django.core import mail
from django.core.mail import EmailMultiAlternatives
from django.core.mail.backends.locmem import EmailBackend
from django.db import IntegrityError, connection, transaction
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

from core.db import violated_constraint
from idempotency import failpoints
from shop import emails
from shop.models import Mail
from shop.tasks import send_mail
from tests.concurrency import Workers, wait_for_lock_waiters

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def bells(monkeypatch) -> list[list[int]]:
    """The rows each bell rang for, instead of publishing (read at call time by on_commit)."""
    rung: list[list[int]] = []
    monkeypatch.setattr(emails, "mails_ring", lambda ids, **_: rung.append(list(ids)))
    return rung


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


def apply(event_type, payload, message_id=None):
    return emails.email_apply(
        message_id=message_id or str(uuid.uuid4()), event_type=event_type, payload=payload
    ).outcome


def send_due() -> str:
    return emails.mails_send(
        mail_ids=list(Mail.objects.order_by("id").values_list("id", flat=True))
    ).summary()


def make_due_again(row: Mail) -> None:
    """Time passes (database clock): the backoff and any lease are over."""
    Mail.objects.filter(pk=row.pk).update(next_attempt_at=Now(), lease_expires_at=Now())


@pytest.mark.parametrize(
    ("event_type", "extra", "needle"),
    [
        ("order.confirmed", {}, "€39.98"),
        ("order.partially_confirmed", {}, "confirmed"),
        ("order.payment_failed", {"status": "payment_failed"}, "declined"),
        ("order.shipment_created", {"carrier": "DHL", "tracking_number": "TRK-777"}, "TRK-777"),
        (
            "refund.succeeded",
            {"amount": "12.50", "reference": "order-42", "refund_id": "r1"},
            "€12.50",
        ),
    ],
)
def test_each_mail_has_both_parts_the_recipient_and_its_content(shopper, event_type, extra, needle):
    assert apply(event_type, order_payload(shopper, **extra)) == "queued"
    assert mail.outbox == []  # written, not sent: sending is off the delivery path
    assert send_due() == "sent:1"
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert isinstance(message, EmailMultiAlternatives)
    assert message.to == [shopper.email]
    assert "42" in message.subject
    assert needle in message.body
    (html, mimetype), *_ = message.alternatives
    assert mimetype == "text/html"
    assert needle in html
    row = Mail.objects.get()
    assert row.done_at is not None and row.attempts == 1 and not row.needs_attention


def test_other_event_types_write_no_mail(shopper):
    assert apply("order.cancelled", order_payload(shopper)) == "ignored"
    assert not Mail.objects.exists()


def test_the_same_event_twice_writes_one_mail_and_sends_it_once(shopper, bells):
    payload = order_payload(shopper)
    assert apply("order.confirmed", payload, message_id="m-1") == "queued"
    assert apply("order.confirmed", payload, message_id="m-1") == "duplicate"
    assert Mail.objects.count() == 1
    assert bells == [[Mail.objects.get().pk]]  # rung once, after the commit that wrote it
    assert send_due() == "sent:1"
    assert send_due() == "skipped:1"  # done: a second ring sends nothing
    assert len(mail.outbox) == 1


def test_a_rolled_back_write_rings_no_bell_and_leaves_no_row(shopper, bells):
    with pytest.raises(RuntimeError), transaction.atomic():
        apply("order.confirmed", order_payload(shopper), message_id="m-back")
        raise RuntimeError("the batch failed after the write")
    assert bells == [] and not Mail.objects.exists()


def test_a_shopper_without_address_gets_no_mail(shopper):
    shopper.email = ""
    shopper.save(update_fields=["email"])
    assert apply("order.confirmed", order_payload(shopper), message_id="m-2") == "no_address"
    assert not Mail.objects.exists()


def test_one_connection_sends_a_ring_of_mails(make_user, monkeypatch):
    shoppers = [make_user() for _ in range(3)]
    for s in shoppers:
        apply("order.confirmed", order_payload(s))
    opened = []
    real_open = EmailBackend.open
    monkeypatch.setattr(EmailBackend, "open", lambda self: opened.append(self) or real_open(self))
    assert send_mail(list(Mail.objects.values_list("id", flat=True))) == "sent:3"
    assert len(opened) == 1
    assert sorted(m.to[0] for m in mail.outbox) == sorted(s.email for s in shoppers)


# --- sending: due work ------------------------------------------------------------------


def test_a_sender_past_its_time_budget_leaves_the_rest_due(make_user, monkeypatch):
    for _ in range(3):
        apply("order.confirmed", order_payload(make_user()))
    monkeypatch.setattr(emails, "send_budget", lambda: 0.0)
    assert send_due() == "left:2,sent:1"  # one send always; then no attempt begins
    left = Mail.objects.filter(done_at__isnull=True)
    assert left.count() == 2 and set(left.values_list("attempts", flat=True)) == {0}
    assert sorted(emails.mails_sweep(limit=10)) == sorted(left.values_list("id", flat=True))


def test_a_ring_of_mails_takes_and_ends_its_attempts_in_one_statement_each(make_user):
    for _ in range(4):
        apply("order.confirmed", order_payload(make_user()))
    ids = list(Mail.objects.order_by("id").values_list("id", flat=True))
    with CaptureQueriesContext(connection) as queries:
        result = emails.mails_send(mail_ids=ids)
    assert result.summary() == "sent:4" and len(mail.outbox) == 4
    writes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert len(writes) == 2  # the ring's attempts begun, then its sends marked done
    rows = Mail.objects.order_by("id")
    assert all(r.done_at is not None and r.attempts == 1 for r in rows)


def test_the_rows_of_a_ring_are_leased_for_the_sends_before_them(make_user, monkeypatch):
    for _ in range(3):
        apply("order.confirmed", order_payload(make_user()))
    ids = list(Mail.objects.order_by("id").values_list("id", flat=True))
    leases = {}

    def look(name):
        if not leases:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT id, EXTRACT(EPOCH FROM lease_expires_at - now())::float"
                    " FROM shop_mail ORDER BY id"
                )
                leases.update(cursor.fetchall())

    with failpoints.hook("mail.sent", look):
        assert emails.mails_send(mail_ids=ids).summary() == "sent:3"
    one = Mail.due_policy().attempt_lease_seconds
    cap = emails.send_budget() + one  # no send begins after the budget: the task's worst case
    for position, pk in enumerate(ids, start=1):
        expected = min(position * one, cap)
        assert expected - 5 < leases[pk] <= expected, (position, leases)
    assert leases[ids[0]] < leases[ids[1]]


def test_a_failed_send_is_recorded_and_sent_once_when_due_again(shopper, monkeypatch):
    def boom(self, fail_silently=False):
        raise OSError("smtp down")

    apply("order.confirmed", order_payload(shopper), message_id="m-3")
    monkeypatch.setattr(EmailMultiAlternatives, "send", boom)
    assert send_due() == "failed:1"
    row = Mail.objects.get()
    assert "smtp down" in row.last_error and row.done_at is None and row.attempts == 1
    assert not row.lease_owner  # freed: the next attempt waits only for the backoff
    monkeypatch.undo()
    assert send_due() == "skipped:1"  # the backoff runs (database clock)
    make_due_again(row)
    assert send_due() == "sent:1"
    assert len(mail.outbox) == 1
    assert Mail.objects.get().attempts == 2


def test_a_mail_that_keeps_failing_needs_attention_and_staff_can_retry_it(
    shopper, monkeypatch, settings, bells
):
    settings.SHOP_MAIL_MAX_ATTEMPTS = 2
    monkeypatch.setattr(EmailMultiAlternatives, "send", lambda self, fail_silently=False: 1 / 0)
    apply("order.confirmed", order_payload(shopper))
    row = Mail.objects.get()
    assert send_due() == "failed:1"
    make_due_again(row)
    assert send_due() == "needs_attention:1"
    row.refresh_from_db()
    assert row.needs_attention and row.done_at is None and "ZeroDivisionError" in row.last_error
    make_due_again(row)
    assert send_due() == "skipped:1"  # waits for staff, whatever rings
    monkeypatch.undo()
    with pytest.MonkeyPatch.context() as patch:
        rang = []
        patch.setattr(
            "core.due.doorbell.ring", lambda model, pk, delay=0.0, **_: rang.append((model, pk))
        )
        assert emails.mail_retry_now(mail_id=row.pk)
    assert rang == [(Mail, row.pk)]
    assert send_mail(row.pk) == "sent:1"  # the bell's one id
    assert len(mail.outbox) == 1


def test_a_sender_killed_after_the_send_before_the_mark_sends_again_after_the_lease(shopper, bells):
    # At least once, as before: nothing makes an SMTP send and a commit atomic.
    apply("order.confirmed", order_payload(shopper))
    row = Mail.objects.get()

    def killed(name):
        raise SystemExit("worker killed")

    with failpoints.hook("mail.sent", killed), pytest.raises(SystemExit):
        emails.mails_send(mail_ids=[row.pk])
    assert len(mail.outbox) == 1
    row.refresh_from_db()
    assert row.done_at is None and row.lease_owner.startswith("attempt ")
    # While the attempt's lease runs, no second attempt (the first may still be sending).
    Mail.objects.filter(pk=row.pk).update(next_attempt_at=Now())
    assert emails.mails_send(mail_ids=[row.pk]).summary() == "skipped:1"
    assert emails.mails_sweep(limit=10) == []
    # The lease runs out (database clock): the sweeper finds the row and it is sent again.
    Mail.objects.filter(pk=row.pk).update(lease_expires_at=Now())
    assert emails.mails_sweep(limit=10) == [row.pk]
    assert bells[-1] == [row.pk]
    assert send_mail([row.pk]) == "sent:1"
    assert len(mail.outbox) == 2
    row.refresh_from_db()
    assert row.done_at is not None and row.attempts == 2


# --- two copies at once -----------------------------------------------------------


def race(monkeypatch, apply_copy):
    """Two copies released together; the first holds its inbox claim until the second waits."""
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
        return apply_copy()

    workers = Workers()
    workers.start(deliver)
    workers.start(deliver)
    assert claimed.wait(timeout=30)
    wait_for_lock_waiters(1)  # the overlap is real: the second copy waits on the claim
    release.set()
    return workers.join()


def test_two_copies_at_once_write_one_mail(shopper, monkeypatch):
    payload = order_payload(shopper)
    outcomes = race(monkeypatch, lambda: apply("order.confirmed", payload, message_id="m-race"))
    assert sorted(outcomes) == ["duplicate", "queued"]
    assert Mail.objects.filter(message_id="m-race").count() == 1
    assert send_due() == "sent:1"
    assert len(mail.outbox) == 1


def wrong_write(*, message_id, shopper, checked: threading.Barrier, seen: list) -> str:
    """Deliberately wrong twin: check for the row, then insert (no inbox claim first)."""
    with transaction.atomic():
        exists = Mail.objects.filter(message_id=message_id).exists()
        checked.wait(timeout=30)  # both copies have looked before either writes
        if exists:
            return "duplicate"
        seen.append(message_id)  # this copy decided to write
        try:
            with transaction.atomic():
                Mail.objects.create(
                    message_id=message_id,
                    event_type="order.confirmed",
                    payload={},
                    user=shopper,
                    address=shopper.email,
                )
        except IntegrityError as exc:
            return violated_constraint(exc) or "?"
    return "queued"


def test_the_check_then_insert_twin_would_write_two_mails(shopper):
    checked, seen = threading.Barrier(2), []
    workers = Workers()
    for _ in range(2):
        workers.start(
            wrong_write, message_id="m-wrong", shopper=shopper, checked=checked, seen=seen
        )
    outcomes = workers.join()
    connection.close()
    # Both copies saw no row and both wrote: only the unique constraint kept the second
    # row out. Without the inbox claim first and the constraint, two mails would go out.
    assert seen == ["m-wrong", "m-wrong"]
    assert sorted(outcomes) == ["queued", emails.MAIL_CONSTRAINT]
    assert Mail.objects.filter(message_id="m-wrong").count() == 1


def test_the_purge_deletes_sent_mails_past_the_retention_and_keeps_the_rest(make_user, settings):
    settings.SHOP_MAIL_RETENTION = 3600.0
    user = make_user()
    for name in ("old-sent", "new-sent", "old-pending", "old-flagged"):
        apply("order.confirmed", order_payload(user), message_id=name)
    assert send_due() == "sent:4"
    # Age the rows by the database clock; one is not sent yet, one needs a person.
    aged = Now() - datetime.timedelta(hours=2)
    Mail.objects.exclude(message_id="new-sent").update(done_at=aged, created_at=aged)
    Mail.objects.filter(message_id="old-pending").update(done_at=None)
    Mail.objects.filter(message_id="old-flagged").update(done_at=None, needs_attention=True)

    assert emails.mails_purge(batch=1) == 1  # batches of one: the loop ends on a short batch
    assert sorted(Mail.objects.values_list("message_id", flat=True)) == [
        "new-sent",
        "old-flagged",
        "old-pending",
    ]
    assert emails.mails_purge() == 0
