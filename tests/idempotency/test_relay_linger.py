"""The relay lingers to fill a ring while the lag is far below its target, and only then.

In-process: the relay's publish is captured (no broker) and its sleep replaced by
one that writes the rows a trickle would have written meanwhile (docs/events.md,
"The relay").
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now

from idempotency.messaging import relay
from idempotency.models import OutboxMessage
from shop import events
from tests.shop.test_consumers import write
from tests.shop.test_history import order_payload

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rings(monkeypatch):
    """Capture what the relay would put on the broker: (task name, [message ids]) per ring."""
    sent: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(relay, "publish", lambda pairs: sent.extend(relay.rings(pairs)))
    return sent


class Trickle:
    """The relay's clock: a sleep of the linger is the time in which `per_wait` rows arrive."""

    def __init__(self, owner, per_wait: int):
        self.owner = owner
        self.per_wait = per_wait
        self.sleeps: list[float] = []
        self.written = 0

    def arrive(self, n: int) -> None:
        for _ in range(n):
            self.written += 1
            write(events.ORDER_CONFIRMED, order_payload(self.owner, number=self.written))

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.arrive(self.per_wait)


def _relay_a_trickle(trickle: Trickle, *, polls: int, per_poll: int) -> None:
    for _ in range(polls):
        trickle.arrive(per_poll)
        while relay.relay_once():
            pass


def _history_rings(sent) -> list[list[str]]:
    return [ids for task, ids in sent if task == "shop.consume_history"]


def test_under_a_trickle_the_relay_sends_fewer_fuller_rings(shopper, rings, monkeypatch, settings):
    settings.OUTBOX_RELAY_LINGER = 0.05
    trickle = Trickle(shopper, per_wait=3)
    monkeypatch.setattr(relay.time, "sleep", trickle.sleep)
    _relay_a_trickle(trickle, polls=5, per_poll=2)
    # Each poll finds 2 rows, lingers once and takes the 3 that came meanwhile.
    assert trickle.sleeps == [0.05] * 5
    assert [len(ids) for ids in _history_rings(rings)] == [5] * 5
    assert OutboxMessage.objects.filter(done_at__isnull=True).count() == 0


def test_without_the_linger_the_same_trickle_takes_a_ring_per_poll(
    shopper, rings, monkeypatch, settings
):
    # The relay that never waits: the same 25 rows, in rings of 2 and 3 (twice as many).
    settings.OUTBOX_RELAY_LINGER = 0
    trickle = Trickle(shopper, per_wait=0)
    monkeypatch.setattr(relay.time, "sleep", trickle.sleep)
    for _ in range(5):
        trickle.arrive(2)
        relay.relay_once()
        trickle.arrive(3)
        relay.relay_once()
    assert trickle.sleeps == []
    assert [len(ids) for ids in _history_rings(rings)] == [2, 3] * 5


def test_with_the_lag_near_its_target_the_relay_does_not_linger(
    shopper, rings, monkeypatch, settings
):
    settings.OUTBOX_RELAY_LINGER = 0.05
    settings.OUTBOX_LAG_TARGET = 2.0
    trickle = Trickle(shopper, per_wait=3)
    monkeypatch.setattr(relay.time, "sleep", trickle.sleep)
    trickle.arrive(2)
    # Written 1.5 s ago by the database clock: far past a tenth of the 2 s target.
    OutboxMessage.objects.update(created_at=Now() - timedelta(seconds=1.5))
    assert relay.relay_once() == 2
    assert trickle.sleeps == []
    assert [len(ids) for ids in _history_rings(rings)] == [2]
    # A full ring never waits either, however young.
    settings.OUTBOX_CONSUMER_BATCH = 4
    rings.clear()
    trickle.arrive(4)
    assert relay.relay_once() == 4 and trickle.sleeps == []


def test_the_linger_that_ignores_the_lag_twin_delays_a_late_row(
    shopper, rings, monkeypatch, settings
):
    # DELIBERATELY WRONG: a linger judged by the ring's fill alone. A row already near the
    # lag target waits once more, and its lag grows by the linger at every poll.
    settings.OUTBOX_RELAY_LINGER = 0.05
    settings.OUTBOX_LAG_TARGET = 2.0
    monkeypatch.setattr(
        relay,
        "linger_for",
        lambda *, claimed, oldest, limit: float(settings.OUTBOX_RELAY_LINGER),
    )
    trickle = Trickle(shopper, per_wait=0)
    monkeypatch.setattr(relay.time, "sleep", trickle.sleep)
    trickle.arrive(2)
    OutboxMessage.objects.update(created_at=Now() - timedelta(seconds=1.5))
    assert relay.relay_once() == 2
    assert trickle.sleeps == [0.05]
