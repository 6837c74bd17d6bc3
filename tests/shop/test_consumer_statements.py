"""The SQL statements of one ring, counted: a ring of 1 and a ring of 50 cost the same.

Every statement is a round trip and PostgreSQL work per ring; under a steady trickle
the rings are small and many, so what scales with the rows in a ring is what a
delivery costs (docs/events.md, "Batched consumers"). Each consumer's ring (claim,
apply, mark done), and the mail sender's, is counted for 1 and 50 rows of 50 shoppers.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from idempotency.messaging import relay
from shop import emails, events
from shop.models import Mail
from shop.tasks import consume_emails, consume_history, consume_loyalty
from tests.shop.test_consumers import write
from tests.shop.test_history import order_payload

pytestmark = pytest.mark.django_db(transaction=True)

TASKS = {
    "shop.consume_loyalty": consume_loyalty,
    "shop.consume_history": consume_history,
    "shop.consume_emails": consume_emails,
}
# Transaction control the driver sends as commands of their own.
CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE SAVEPOINT")
# Per ring, whatever its size: the claim (lock + count the fresh attempts: 2), the apply
# (lock and read with the messages, the consumer's statements, mark done: 2 + theirs).
# Loyalty: ensure the accounts, lock and read them with the ids seen, read the tallies,
# one versioned UPDATE of every account, one upsert of the tallies (5). History: the
# owners, the inbox claim, one upsert of the lines, one UPDATE of the cancelled orders'
# lines, one of the nets (5; the cancellation's only when the ring has one). E-mails:
# the owners, the inbox claim, the mail rows, their lease for the ring (4).
STATEMENTS = {
    "shop.consume_loyalty": 4 + 5,
    "shop.consume_history": 4 + 4,
    "shop.consume_emails": 4 + 4,
}
# The sender: begin every attempt, read the rows with their shoppers, read the orders'
# numbers and languages (each mail in its order's language), mark the sent done.
SENDER_STATEMENTS = 4


def _statements(queries) -> list[str]:
    return [q["sql"] for q in queries if not q["sql"].upper().startswith(CONTROL)]


@pytest.fixture
def rings(monkeypatch, settings):
    """The three consumers registered (e-mails is off in the test settings), no linger, no
    bell; the relay's rings captured: (task name, [message ids])."""
    settings.OUTBOX_RELAY_LINGER = 0
    monkeypatch.setattr(relay, "_consumers", dict(relay._consumers))
    relay.register_consumer(
        emails.CONSUMER, task="shop.consume_emails", event_types=emails.EVENT_TYPES
    )
    monkeypatch.setattr(emails, "mails_ring", lambda ids, **_: None)
    sent: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(relay, "publish", lambda pairs: sent.extend(relay.rings(pairs)))
    return sent


def _ring_statements(make_user, rings, n: int) -> dict[str, list[str]]:
    for number in range(n):
        write(events.ORDER_CONFIRMED, order_payload(make_user(), number=number + 1))
    rings.clear()
    relay.relay_once()
    counted = {}
    for task, ids in rings:
        assert len(ids) == n
        with CaptureQueriesContext(connection) as queries:
            TASKS[task](ids)
        counted[task] = _statements(queries)
    return counted


@pytest.mark.parametrize("n", [1, 50])
def test_a_ring_costs_the_same_statements_for_1_and_50_rows(make_user, rings, n):
    counted = _ring_statements(make_user, rings, n)
    assert set(counted) == set(STATEMENTS)
    for task, statements in counted.items():
        assert len(statements) == STATEMENTS[task], (task, "\n".join(s[:120] for s in statements))


@pytest.mark.parametrize("n", [1, 50])
def test_the_mail_sender_costs_the_same_statements_for_1_and_50_mails(make_user, rings, n):
    _ring_statements(make_user, rings, n)
    ids = list(Mail.objects.values_list("pk", flat=True))
    assert len(ids) == n
    with CaptureQueriesContext(connection) as queries:
        result = emails.mails_send(mail_ids=ids)
    assert set(map(str, result.results.values())) == {"sent"}
    statements = _statements(queries)
    assert len(statements) == SENDER_STATEMENTS, "\n".join(s[:120] for s in statements)
