"""A mail's attempt lease covers its whole send, against a real SMTP server that answers slowly.

Issue 32, finding 9: `EMAIL_TIMEOUT` bounds each socket operation, not the
send, and the attempt's lease was twice it plus a margin. A live relay that
dribbles its replies (each read well within the timeout) kept the send going
past the lease; the sweeper began a second attempt, which sent too: two
e-mails, no crash. Now the send has a total deadline (`EMAIL_SEND_DEADLINE`,
`core.mail.SMTPBackend`) and the lease is that deadline plus the margin
(docs/events.md, "Shopper e-mails"). The server is Python's own, on loopback
(tests/support/slow_smtp.py); the timeouts are scaled down to seconds.
"""

from __future__ import annotations

import time
import uuid

import pytest
from django.conf import settings as django_settings
from django.db.models.functions import Now

from config.settings.email_url import SMTP
from core import due
from shop import emails
from shop.models import Mail
from tests.concurrency import Workers, wait_until
from tests.support.slow_smtp import slow_smtp

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 0.5  # EMAIL_TIMEOUT: each socket operation
PACE = 0.05  # the server's seconds per reply byte: every read waits far less than TIMEOUT
MARGIN = 0.3  # DUE_ATTEMPT_MARGIN
DEADLINE = 4.0  # EMAIL_SEND_DEADLINE: longer than the slow conversation, so it finishes


@pytest.fixture(autouse=True)
def no_bells(monkeypatch):
    monkeypatch.setattr(emails, "mails_ring", lambda ids, **_: None)


@pytest.fixture
def server(settings):
    """The slow relay, and the settings that send to it (EMAIL_URL's SMTP backend)."""
    with slow_smtp(pace=PACE) as relay:
        settings.EMAIL_BACKEND = SMTP
        settings.EMAIL_HOST, settings.EMAIL_PORT = relay.host, relay.port
        settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
        settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
        settings.EMAIL_TIMEOUT = TIMEOUT
        settings.EMAIL_SEND_DEADLINE = DEADLINE
        settings.DUE_ATTEMPT_MARGIN = MARGIN
        settings.SHOP_MAIL_BACKOFF_BASE = 0.05
        settings.SHOP_MAIL_BACKOFF_MAX = 0.1
        yield relay


@pytest.fixture
def mail_row(shopper) -> Mail:
    payload = {"order_id": str(uuid.uuid4()), "number": 42, "owner_id": shopper.pk}
    result = emails.email_apply(
        message_id=str(uuid.uuid4()), event_type="order.confirmed", payload=payload
    )
    assert result.outcome == emails.Outcome.QUEUED
    return Mail.objects.get()


# -- the wrong twin: the lease before, and Django's backend without a deadline ------------------


def old_due_policy() -> due.DuePolicy:
    """WRONG (the policy before): "one send" leased for twice EMAIL_TIMEOUT plus the margin."""
    return due.DuePolicy.from_settings(
        "SHOP_MAIL",
        task="shop.send_mail",
        attempt_lease=2 * float(django_settings.EMAIL_TIMEOUT) + django_settings.DUE_ATTEMPT_MARGIN,
    )


@pytest.fixture
def without_a_deadline(settings, monkeypatch):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    monkeypatch.setattr(Mail, "due_policy", classmethod(lambda cls: old_due_policy()))


# -- one send, and the sweeper looking while it is still under way ---------------------------------


def send_while_the_sweeper_looks(mail_id, relay) -> tuple[emails.SendResult, emails.SendResult]:
    """The sender (a thread) is in its slow conversation; once twice EMAIL_TIMEOUT plus the
    margin has passed (the lease before), the sweeper's ring runs `mails_send` for the row."""
    old_lease = 2 * TIMEOUT + MARGIN
    assert relay.conversation_seconds() > old_lease + 1.0  # the send outlasts the old lease
    assert relay.conversation_seconds() < DEADLINE - 1.0  # and finishes within the deadline
    senders = Workers()
    started = time.monotonic()
    senders.start(emails.mails_send, mail_ids=[mail_id])
    wait_until(lambda: relay.connections >= 1, timeout=10, what="the first send connected")
    time.sleep(max(0.0, started + old_lease + 0.3 - time.monotonic()))
    assert relay.delivered == []  # the overlap: the first send is still in its conversation
    second = emails.mails_send(mail_ids=[mail_id])  # the sweeper's ring, on the due row
    (first,) = senders.join(timeout=30)
    return first, second


def test_a_slow_relay_gets_one_mail_the_lease_covers_the_whole_send(server, mail_row):
    assert Mail.due_policy().attempt_lease_seconds == DEADLINE + MARGIN
    first, second = send_while_the_sweeper_looks(mail_row.id, server)
    assert first.results == {mail_row.id: emails.Sent.SENT}
    assert second.results == {mail_row.id: emails.Sent.SKIPPED}  # the first attempt's lease holds
    assert len(server.delivered) == 1 and server.connections == 1
    row = Mail.objects.get()
    assert row.done_at is not None and row.attempts == 1


def test_wrong_twin_without_the_deadline_the_sweeper_sends_a_second_mail(
    server, mail_row, without_a_deadline
):
    first, second = send_while_the_sweeper_looks(mail_row.id, server)
    assert second.results == {mail_row.id: emails.Sent.SENT}
    assert len(server.delivered) == 2  # no crash at all, and the shopper got two e-mails
    assert server.connections == 2


def test_a_send_slower_than_its_deadline_ends_within_the_lease_and_is_sent_later(
    server, mail_row, settings
):
    settings.EMAIL_SEND_DEADLINE = 1.0
    settings.DUE_ATTEMPT_MARGIN = 1.0  # room for a busy test machine around the send
    server.pace = 0.08  # still far under EMAIL_TIMEOUT per read
    lease = Mail.due_policy().attempt_lease_seconds
    assert server.conversation_seconds() > lease + 1.0  # would outlast the lease unbounded
    started = time.monotonic()
    result = emails.mails_send(mail_ids=[mail_row.id])
    took = time.monotonic() - started
    assert result.results == {mail_row.id: emails.Sent.FAILED}
    # Abandoned at the deadline, before the lease ran out: recorded, the lease freed.
    assert 1.0 <= took < lease, took
    row = Mail.objects.get()
    assert "deadline" in row.last_error, row.last_error
    assert row.done_at is None and row.lease_owner == "" and row.attempts == 1
    assert server.delivered == []  # cut mid-conversation: the relay has no message
    # The relay answers briskly again: the retry (due after the backoff) sends it once.
    server.pace = 0.0
    Mail.objects.filter(id=row.id).update(next_attempt_at=Now())
    assert emails.mails_send(mail_ids=[row.id]).results == {row.id: emails.Sent.SENT}
    assert len(server.delivered) == 1
