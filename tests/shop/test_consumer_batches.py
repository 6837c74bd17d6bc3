"""Batched consumers: one ring per consumer per batch, every effect once, a poison message alone.

In-process: the relay's publish is captured as the rings it would send (one
(task, [ids]) per consumer per batch), and the tasks are run with those lists.
The one-delivery path (a single id) is tests/shop/test_consumers.py.
"""

from __future__ import annotations

import json
import threading
import uuid
from datetime import timedelta

import pytest
import redis
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

from core import due
from idempotency import failpoints, metrics
from idempotency.messaging import deliveries, relay
from idempotency.models import Delivery, InboxMessage
from shop import emails, events, history
from shop.models import Mail
from shop.tasks import consume_emails, consume_history, consume_loyalty
from tests.shop.test_consumers import balance, history_quantity, write
from tests.shop.test_history import order_payload, return_payload

pytestmark = pytest.mark.django_db(transaction=True)

TASKS = {
    "shop.consume_loyalty": consume_loyalty,
    "shop.consume_history": consume_history,
    "shop.consume_emails": consume_emails,
}
POINTS = 38  # order_payload: 2 x 19.99


@pytest.fixture
def rings(monkeypatch):
    """Capture what the relay would put on the broker: (task name, [message ids]) per ring."""
    sent: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(relay, "publish", lambda pairs: sent.extend(relay.rings(pairs)))
    return sent


def run(sent) -> list[str]:
    return [TASKS[name](ids) for name, ids in sent]


def test_one_ring_per_consumer_applies_the_whole_batch_in_one_go(make_user, rings, settings):
    settings.OUTBOX_CONSUMER_BATCH = 4
    shoppers = [make_user() for _ in range(3)]
    ids = [
        write(events.ORDER_CONFIRMED, order_payload(shoppers[i % 3], number=i)) for i in range(6)
    ]
    assert relay.relay_once() == 6
    # Two consumers, six messages, batches of four: 2 rings each, not 12 task messages.
    assert sorted((name, len(batch)) for name, batch in rings) == [
        ("shop.consume_history", 2),
        ("shop.consume_history", 4),
        ("shop.consume_loyalty", 2),
        ("shop.consume_loyalty", 4),
    ]
    assert sorted(m for name, batch in rings if "history" in name for m in batch) == sorted(ids)
    assert sorted(run(rings)) == ["applied:2", "applied:2", "applied:4", "applied:4"]
    assert [balance(s) for s in shoppers] == [2 * POINTS] * 3
    assert [history_quantity(s) for s in shoppers] == [4] * 3
    assert not Delivery.objects.filter(done_at__isnull=True).exists()
    assert set(Delivery.objects.values_list("attempts", flat=True)) == {1}


def test_the_same_batch_delivered_twice_applies_once_and_counts_every_copy(shopper, rings):
    write(events.ORDER_CONFIRMED, order_payload(shopper, number=1))
    write(events.ORDER_CONFIRMED, order_payload(shopper, number=2))
    relay.relay_once()
    before = metrics.duplicate_totals()
    assert sorted(run(rings)) == ["applied:2", "applied:2"]
    assert sorted(run(rings)) == ["applied:2", "applied:2"]  # the copies: acknowledged
    assert balance(shopper) == 2 * POINTS and history_quantity(shopper) == 4
    after = metrics.duplicate_totals()
    assert after[metrics.INBOX_DUPLICATE] - before[metrics.INBOX_DUPLICATE] == 2
    assert after[metrics.PROCESSED_ID] - before[metrics.PROCESSED_ID] == 2
    assert InboxMessage.objects.filter(consumer="purchase_history").count() == 2


def test_a_batch_mixing_new_messages_and_copies_applies_only_the_new(shopper, rings):
    first = write(events.ORDER_CONFIRMED, order_payload(shopper, number=1))
    relay.relay_once()
    run(rings)
    rings.clear()
    order = order_payload(shopper, number=2)
    second = write(events.ORDER_CONFIRMED, order)
    third = write(events.RETURN_COMPLETED, return_payload(shopper, order_id=order["order_id"]))
    relay.relay_once()
    mixed = [(name, [first, *ids]) for name, ids in rings]  # an old copy rides along
    run(mixed)
    assert sorted(rings[0][1]) == sorted([second, third])
    assert balance(shopper) == 2 * POINTS - 19 and history_quantity(shopper) == 3


def test_a_poison_message_in_a_batch_is_a_dead_letter_alone(make_user, rings):
    a, b = make_user(), make_user()
    good_a = write(events.ORDER_CONFIRMED, order_payload(a))
    bad = order_payload(a, number=2)
    bad["lines"][0]["unit_price"] = "not a price"
    poison = write(events.ORDER_CONFIRMED, bad)
    good_b = write(events.ORDER_CONFIRMED, order_payload(b, number=3))
    relay.relay_once()
    assert sorted(run(rings)) == ["applied:2,dead_letter:1"] * 2
    # The neighbours, of the same shopper and of another, are applied once.
    assert balance(a) == POINTS and balance(b) == POINTS
    assert history_quantity(a) == 2 and history_quantity(b) == 2
    dead = Delivery.objects.filter(needs_attention=True)
    assert {str(d.message_id) for d in dead} == {poison} and dead.count() == 2
    assert all("PoisonMessage" in d.last_error and d.attempts == 1 for d in dead)
    done = Delivery.objects.filter(done_at__isnull=False)
    assert {str(d.message_id) for d in done} == {good_a, good_b}
    assert set(done.values_list("attempts", flat=True)) == {1}  # no attempt spent twice
    # A copy of the ring: the dead letter does not run again, the others are copies.
    assert sorted(run(rings)) == ["applied:2,skipped:1"] * 2
    assert balance(a) == POINTS and history_quantity(a) == 2


def test_a_failing_message_in_a_batch_is_retried_then_a_dead_letter_alone(
    make_user, rings, monkeypatch, settings
):
    settings.OUTBOX_DELIVERY_MAX_ATTEMPTS = 3
    shoppers = [make_user() for _ in range(3)]
    payloads = [order_payload(s, number=i) for i, s in enumerate(shoppers)]
    ids = [write(events.ORDER_CONFIRMED, p) for p in payloads]
    broken_order = payloads[1]["order_id"]
    real_effect = history._effect

    def effect(fact):
        if fact.order_id == broken_order:
            raise RuntimeError("the read model is being rebuilt")
        real_effect(fact)

    real_effects = history._effects

    def effects(facts):
        # The batch's effects, all at once: the broken order fails the whole batch.
        if any(fact.order_id == broken_order for fact in facts):
            raise RuntimeError("the read model is being rebuilt")
        real_effects(facts)

    monkeypatch.setattr(history, "_effect", effect)
    monkeypatch.setattr(history, "_effects", effects)
    relay.relay_once()
    history_ring = [(n, batch) for n, batch in rings if n == "shop.consume_history"]
    results = []
    for _ in range(3):
        results += run(history_ring)
        Delivery.objects.filter(consumer="purchase_history", done_at__isnull=True).update(
            next_attempt_at=Now(), lease_expires_at=None
        )
    # Run 1: the batch failed, then one by one: two applied, one failed. Runs 2 and 3:
    # the two are copies; the failing one runs alone and spends its own budget.
    assert results == ["applied:2,failed:1", "applied:2,failed:1", "applied:2,dead_letter:1"]
    rows = {str(d.message_id): d for d in Delivery.objects.filter(consumer="purchase_history")}
    assert rows[ids[1]].needs_attention and rows[ids[1]].attempts == 3
    assert "being rebuilt" in rows[ids[1]].last_error
    for neighbour in (ids[0], ids[2]):
        assert rows[neighbour].done_at is not None and rows[neighbour].attempts == 1
    assert [history_quantity(s) for s in shoppers] == [2, 0, 2]
    # The other consumer is not held back.
    assert run([r for r in rings if r[0] == "shop.consume_loyalty"]) == ["applied:3"]


def test_the_rows_of_a_batch_whose_run_died_run_one_by_one(make_user, rings, monkeypatch):
    shoppers = [make_user() for _ in range(3)]
    for i, s in enumerate(shoppers):
        write(events.ORDER_CONFIRMED, order_payload(s, number=i))
    relay.relay_once()
    # A run that killed its worker mid-batch left every row with its attempt counted.
    Delivery.objects.update(attempts=1)
    batches = []
    real = history.history_apply_many
    monkeypatch.setattr(history, "history_apply_many", lambda ms: batches.append(ms) or real(ms))
    assert sorted(run(rings)) == ["applied:3", "applied:3"]
    assert batches == []  # suspects never ride in a batch: each ran alone
    assert set(Delivery.objects.values_list("attempts", flat=True)) == {2}
    assert [history_quantity(s) for s in shoppers] == [2, 2, 2]


def test_a_spent_budget_in_a_batch_is_a_dead_letter_and_the_rest_apply(make_user, rings, settings):
    settings.OUTBOX_DELIVERY_MAX_ATTEMPTS = 2
    a, b = make_user(), make_user()
    spent = write(events.ORDER_CONFIRMED, order_payload(a))
    write(events.ORDER_CONFIRMED, order_payload(b, number=2))
    relay.relay_once()
    Delivery.objects.filter(message_id=spent).update(attempts=2)
    assert sorted(run(rings)) == ["applied:1,dead_letter:1"] * 2
    assert history_quantity(a) == 0 and history_quantity(b) == 2


def test_ids_that_are_no_uuid_or_no_delivery_are_acknowledged(shopper, rings):
    assert consume_history(["not-a-uuid", str(uuid.uuid4())]) == "skipped:2"
    assert consume_loyalty([]) == ""


# -- two batch consumers over the same deliveries ------------------------------------------


def _two_consumers_at_once(task, ids: list[str]) -> list[deliveries.BatchResult]:
    """Run two batch consumers of `ids` released together, both inside their claim at once."""
    start = threading.Barrier(2, timeout=20)
    inside = threading.Barrier(2, timeout=20)
    results: list[deliveries.BatchResult] = []
    errors: list[BaseException] = []
    consume = deliveries.deliveries_consume

    def claimed(_name):
        inside.wait()  # both claims open (rows locked) at the same time: the overlap

    def worker():
        try:
            start.wait()
            results.append(
                consume(
                    consumer="purchase_history",
                    message_ids=ids,
                    apply_many=history.history_apply_many,
                    apply=history.history_apply,
                    atomic=True,
                )
            )
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    with failpoints.hook("delivery.claimed", claimed):
        threads = [threading.Thread(target=worker) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert not errors, errors
    assert len(results) == 2 and inside.n_waiting == 0 and not inside.broken
    return results


def _applied(result: deliveries.BatchResult) -> set[str]:
    return {m for m, r in result.results.items() if r == deliveries.Result.APPLIED}


def test_two_batch_consumers_over_the_same_deliveries_apply_each_once(make_user, rings):
    shoppers = [make_user() for _ in range(4)]
    ids = [
        write(events.ORDER_CONFIRMED, order_payload(s, number=i)) for i, s in enumerate(shoppers)
    ]
    relay.relay_once()
    first, second = _two_consumers_at_once(consume_history, ids)
    # Both claims held their locks at once (the barrier inside the claim): SKIP LOCKED gave
    # each row to exactly one of them, and the other left it alone.
    assert not _applied(first) & _applied(second)
    assert _applied(first) | _applied(second) == set(ids)
    assert set(
        Delivery.objects.filter(consumer="purchase_history").values_list("attempts", flat=True)
    ) == {1}
    assert InboxMessage.objects.filter(consumer="purchase_history").count() == 4
    assert [history_quantity(s) for s in shoppers] == [2] * 4


def test_the_unlocked_claim_twin_gives_both_consumers_every_row(make_user, rings, monkeypatch):
    # DELIBERATELY WRONG: a claim that locks nothing (no FOR UPDATE SKIP LOCKED, no count
    # that takes row locks). Both consumers take every row and apply the whole batch;
    # only the inbox keeps each effect single.
    monkeypatch.setattr(
        deliveries, "_CLAIM", deliveries._CLAIM.replace(" FOR UPDATE SKIP LOCKED", "")
    )
    monkeypatch.setattr(
        deliveries,
        "_LOCK_AND_READ",
        deliveries._LOCK_AND_READ.replace(" FOR UPDATE OF d SKIP LOCKED", ""),
    )
    monkeypatch.setattr(
        deliveries,
        "_COUNT_FRESH",
        "SELECT id FROM idempotency_delivery WHERE %s IS NOT NULL AND id = ANY(%s)",
    )
    shoppers = [make_user() for _ in range(3)]
    ids = [
        write(events.ORDER_CONFIRMED, order_payload(s, number=i)) for i, s in enumerate(shoppers)
    ]
    relay.relay_once()
    first, second = _two_consumers_at_once(consume_history, ids)
    assert _applied(first) == _applied(second) == set(ids)  # every row taken by both
    assert [history_quantity(s) for s in shoppers] == [2] * 3  # the inbox, not the claim


# -- rings coalesce under load ---------------------------------------------------------------


def _small_rings(n: int, make_user, *, poison_at: int | None = None) -> list[str]:
    """Write `n` orders of three shoppers and relay them ten at a time: rings of 10 ids, as
    a relay that polls a steady stream makes them (the batch stays 200)."""
    shoppers = [make_user() for _ in range(3)]
    ids = []
    for i in range(n):
        payload = order_payload(shoppers[i % 3], number=i)
        if i == poison_at:
            payload["lines"][0]["unit_price"] = "not a price"
        ids.append(write(events.ORDER_CONFIRMED, payload))
    while relay.relay_once(limit=10):
        pass
    return ids


def _pending(consumer: str) -> int:
    return Delivery.objects.filter(consumer=consumer, done_at__isnull=True).count()


def _runs_until_drained(history_rings) -> list[str]:
    """Run the history rings in the relay's order until no history delivery is pending."""
    summaries = []
    for name, ids in history_rings:
        if not _pending("purchase_history"):
            break
        summaries.append(TASKS[name](ids))
    return summaries


def test_rings_coalesce_under_load_many_due_rows_few_rings(make_user, rings):
    ids = _small_rings(500, make_user)
    history_rings = [(n, batch) for n, batch in rings if n == "shop.consume_history"]
    assert len(history_rings) == 50 and {len(batch) for _, batch in history_rings} == {10}
    before = metrics.duplicate_totals()
    # Each run claims its own 10 and, up to the batch of 200, the oldest fresh rows:
    # 500 due deliveries take 3 runs (200 + 190 + 110), not 50.
    summaries = _runs_until_drained(history_rings)
    assert summaries == ["applied:200", "applied:190,taken:10", "applied:110,taken:10"]
    # The later rings find their rows taken ahead: acknowledged, no effect, no copy counted.
    rest = [TASKS[name](batch) for name, batch in history_rings[3:]]
    assert set(rest) == {"taken:10"}
    assert metrics.duplicate_totals() == before
    assert InboxMessage.objects.filter(consumer="purchase_history").count() == 500
    rows = Delivery.objects.filter(consumer="purchase_history")
    assert set(rows.values_list("attempts", flat=True)) == {1}
    assert rows.filter(done_at__isnull=True).count() == 0
    # Every ring arrived and ended the lease of the rows taken ahead of it.
    assert not rows.exclude(lease_owner="").exists()
    assert sorted(str(m) for m in rows.values_list("message_id", flat=True)) == sorted(ids)
    # A copy of a ring after that is a copy again: counted by the consumer.
    assert TASKS[history_rings[7][0]](history_rings[7][1]) == "applied:10"
    after = metrics.duplicate_totals()
    assert after[metrics.INBOX_DUPLICATE] - before[metrics.INBOX_DUPLICATE] == 10


def test_the_only_my_ids_twin_needs_a_ring_per_ten_rows(make_user, rings, monkeypatch):
    # DELIBERATELY WRONG: the claim takes only the ids its ring carries (no room for
    # the consumer's other due rows). Under load every ring of ten ids applies ten rows.
    monkeypatch.setattr(
        deliveries, "_CLAIM", deliveries._CLAIM.replace("LIMIT %(room)s", "LIMIT 0")
    )
    _small_rings(500, make_user)
    history_rings = [(n, batch) for n, batch in rings if n == "shop.consume_history"]
    summaries = _runs_until_drained(history_rings)
    assert summaries == ["applied:10"] * 50


def test_a_poison_message_in_a_coalesced_ring_is_a_dead_letter_alone(make_user, rings):
    ids = _small_rings(60, make_user, poison_at=35)
    poison = ids[35]
    by_consumer: dict[str, list[list[str]]] = {}
    for name, batch in rings:
        by_consumer.setdefault(name, []).append(batch)
    for name, batches in by_consumer.items():
        assert poison not in batches[0]  # the poison rides in a later ring
        # The first ring takes all 60: the batch fails, then one by one.
        assert TASKS[name](batches[0]) == "applied:59,dead_letter:1"
    dead = Delivery.objects.filter(needs_attention=True)
    assert {str(d.message_id) for d in dead} == {poison} and dead.count() == 2
    assert all("PoisonMessage" in d.last_error and d.attempts == 1 for d in dead)
    done = Delivery.objects.filter(done_at__isnull=False)
    assert done.count() == 2 * 59 and set(done.values_list("attempts", flat=True)) == {1}
    assert InboxMessage.objects.filter(consumer="purchase_history").count() == 59
    # The poison's own ring: the dead letter does not run again, its neighbours were taken.
    for name, batches in by_consumer.items():
        own = next(batch for batch in batches if poison in batch)
        assert TASKS[name](own) == "skipped:1,taken:9"
    assert Delivery.objects.filter(needs_attention=True).count() == 2
    assert Delivery.objects.filter(done_at__isnull=True, needs_attention=False).count() == 0


@pytest.fixture
def broker():
    """The broker's Redis database, emptied before and after (ours alone: REDIS_URL's db)."""
    client = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    client.flushdb()
    yield client
    client.flushdb()


def _overdue_backlog(make_user) -> str:
    """Two orders relayed, their deliveries' leases run out undone; return one history id."""
    a, b = make_user(), make_user()
    first = write(events.ORDER_CONFIRMED, order_payload(a))
    write(events.ORDER_CONFIRMED, order_payload(b, number=2))
    relay.relay_once()
    Delivery.objects.update(lease_expires_at=Now())  # past the delivery timeout, still queued
    return first


def test_the_sweeper_rings_again_only_when_no_ring_can_still_be_on_its_way(
    make_user, rings, broker
):
    failed = _overdue_backlog(make_user)
    rings.clear()
    broker.lpush(due.queue_of("shop.consume_history"), b"a ring waiting for a worker")
    # A ring waits in the consumers' queue: it claims what is fresh for its consumer.
    assert relay.deliveries_sweep() == 0 and rings == []
    # An attempt that failed freed its lease: no ring is on its way for that row.
    Delivery.objects.filter(consumer="purchase_history", message_id=failed).update(
        attempts=1, lease_owner="", lease_expires_at=None
    )
    assert relay.deliveries_sweep() == 1
    assert rings == [("shop.consume_history", [failed])]
    # The queue drained and the leases had run out: the rings were lost; ring again.
    broker.delete(due.queue_of("shop.consume_history"))
    assert relay.deliveries_sweep() == 3
    assert set(Delivery.objects.values_list("publishes", flat=True)) == {2}


def test_the_sweep_that_ignores_the_queue_twin_rings_a_queued_backlog_again(
    make_user, rings, broker, monkeypatch
):
    # DELIBERATELY WRONG: the sweep judges by the lease alone. A backlog older than the
    # delivery timeout, its rings merely waiting in the queue, is rung a second time.
    monkeypatch.setattr(relay, "_waiting_consumers", lambda: [])
    _overdue_backlog(make_user)
    rings.clear()
    broker.lpush(due.queue_of("shop.consume_history"), b"a ring waiting for a worker")
    assert relay.deliveries_sweep() == 4 and len(rings) == 2


def _a_ring_of(task: str) -> bytes:
    """A waiting task message as Celery writes it to Redis (protocol 2: the task in headers)."""
    return json.dumps({"body": "", "headers": {"task": task, "id": uuid.uuid4().hex}}).encode()


def test_a_waiting_ring_holds_back_only_its_own_consumers_rows_at_the_sweeper(
    make_user, rings, broker
):
    # Loyalty and history share the `events` queue; a history ring waits in it.
    _overdue_backlog(make_user)
    rings.clear()
    queue = due.queue_of("shop.consume_history")
    assert queue == due.queue_of("shop.consume_loyalty")
    broker.lpush(queue, _a_ring_of("shop.consume_history"))
    # Loyalty's rows have no ring on its way: rung again; history's ring claims its own.
    assert relay.deliveries_sweep() == 2
    assert [task for task, _ in rings] == ["shop.consume_loyalty"]
    assert set(
        Delivery.objects.filter(consumer="purchase_history").values_list("publishes", flat=True)
    ) == {1}


def test_the_whole_queue_judgement_twin_holds_back_every_consumer_behind_one_ring(
    make_user, rings, broker, monkeypatch
):
    # DELIBERATELY WRONG: any message in the shared queue counts for every consumer of it,
    # so a history ring holds back loyalty's rows, which no ring is on its way for.
    monkeypatch.setattr(due, "queued_tasks", lambda queue, **kwargs: None)
    _overdue_backlog(make_user)
    rings.clear()
    broker.lpush(due.queue_of("shop.consume_history"), _a_ring_of("shop.consume_history"))
    assert relay.deliveries_sweep() == 0 and rings == []


# -- shop_outbox_lag_seconds ----------------------------------------------------------------


def _lag(consumer: str) -> tuple[float, float]:
    from backoffice import metrics as endpoint

    registry = endpoint.registry()
    labels = {"consumer": consumer}
    count = registry.get_sample_value("shop_outbox_lag_seconds_count", labels) or 0.0
    total = registry.get_sample_value("shop_outbox_lag_seconds_sum", labels) or 0.0
    return count, total


def test_the_lag_is_observed_once_per_applied_delivery_per_consumer(shopper, rings, client):
    ids = [write(events.ORDER_CONFIRMED, order_payload(shopper, number=i)) for i in range(3)]
    # Written 1 minute ago by the database clock: the lag is created -> done, not run time.
    from idempotency.models import OutboxMessage

    OutboxMessage.objects.filter(pk__in=ids).update(created_at=Now() - timedelta(minutes=1))
    relay.relay_once()
    before = {c: _lag(c) for c in ("loyalty", "purchase_history")}
    run(rings)
    run(rings)  # copies: nothing new is applied, nothing observed
    for consumer in ("loyalty", "purchase_history"):
        count, total = _lag(consumer)
        assert count - before[consumer][0] == 3
        assert 3 * 60 <= total - before[consumer][1] < 3 * 600
    # The one-delivery path observes too.
    one = write(events.ORDER_CONFIRMED, order_payload(shopper, number=9))
    rings.clear()
    relay.relay_once()
    count = _lag("purchase_history")[0]
    assert consume_history(one) == "applied:applied"
    assert _lag("purchase_history")[0] == count + 1
    text = client.get("/metrics").content.decode()
    assert "# TYPE shop_outbox_lag_seconds histogram" in text
    assert 'shop_outbox_lag_seconds_bucket{consumer="purchase_history",le="2.0"}' in text


def test_a_rolled_back_batch_observes_no_lag(shopper, rings, monkeypatch):
    write(events.ORDER_CONFIRMED, order_payload(shopper))
    relay.relay_once()

    def broken(messages):
        raise RuntimeError("down")

    def broken_one(**kwargs):
        raise RuntimeError("down")

    monkeypatch.setattr(history, "history_apply_many", broken)
    monkeypatch.setattr(history, "history_apply", broken_one)
    before = _lag("purchase_history")[0]
    assert run([r for r in rings if r[0] == "shop.consume_history"]) == ["failed:1"]
    assert _lag("purchase_history")[0] == before


# -- the e-mails consumer: batched like the others, mail rows written, sent later --------------

EMAILS_TASK = "shop.consume_emails"


@pytest.fixture
def emails_on(monkeypatch):
    """Register the e-mails consumer (off in the test settings), rings of 2 ids; no bell."""
    monkeypatch.setattr(relay, "_consumers", dict(relay._consumers))
    relay.register_consumer(
        emails.CONSUMER, task=EMAILS_TASK, event_types=emails.EVENT_TYPES, batch=2
    )
    monkeypatch.setattr(emails, "mails_ring", lambda ids, **_: None)


def _email_rings(sent) -> list[tuple[str, list[str]]]:
    return [(name, ids) for name, ids in sent if name == EMAILS_TASK]


def _email_rows() -> dict[str, Delivery]:
    return {str(d.message_id): d for d in Delivery.objects.filter(consumer=emails.CONSUMER)}


def _mails() -> dict[str, Mail]:
    return {m.message_id: m for m in Mail.objects.all()}


def _send_all() -> str:
    return emails.mails_send(mail_ids=list(Mail.objects.values_list("id", flat=True))).summary()


def test_an_emails_ring_carries_many_ids_and_writes_each_mail_once_in_one_transaction(
    make_user, rings, emails_on, settings
):
    from django.core import mail

    settings.OUTBOX_CONSUMER_BATCH = 4
    shoppers = [make_user() for _ in range(3)]
    ids = [
        write(events.ORDER_CONFIRMED, order_payload(shoppers[i % 3], number=i)) for i in range(5)
    ]
    assert relay.relay_once() == 5
    # The consumer's own ring size (2), the others' OUTBOX_CONSUMER_BATCH (4): 3 rings.
    assert [len(batch) for _, batch in _email_rings(rings)] == [2, 2, 1]
    assert [m for _, batch in _email_rings(rings) for m in batch] == ids
    with CaptureQueriesContext(connection) as queries:
        assert run(_email_rings(rings)[:1]) == ["applied:2"]
    # The batch path: one owner query and one mail insert for the ring, not one per mail.
    sql = [q["sql"] for q in queries.captured_queries]
    assert sum("auth_user" in q for q in sql) == 1
    assert sum(q.startswith("INSERT INTO shop_mail") for q in sql) == 1
    assert run(_email_rings(rings)[1:]) == ["applied:2", "applied:1"]
    assert mail.outbox == []  # no mail sent while a delivery waits
    rows = _email_rows()
    assert all(r.done_at is not None and r.attempts == 1 for r in rows.values())
    assert InboxMessage.objects.filter(consumer=emails.CONSUMER).count() == 5
    assert sorted(_mails()) == sorted(ids)
    assert _send_all() == "sent:5"
    assert sorted(m.to[0] for m in mail.outbox) == sorted(shoppers[i % 3].email for i in range(5))


def test_the_same_emails_ring_delivered_twice_writes_no_second_mail(make_user, rings, emails_on):
    shoppers = [make_user() for _ in range(2)]
    for i, s in enumerate(shoppers):
        write(events.ORDER_CONFIRMED, order_payload(s, number=i))
    relay.relay_once()
    (ring,) = _email_rings(rings)
    assert run([ring]) == ["applied:2"]
    before = metrics.duplicate_totals()
    assert run([ring]) == ["applied:2"]  # the copies: acknowledged, no second row
    assert Mail.objects.count() == 2
    after = metrics.duplicate_totals()
    assert after[metrics.INBOX_DUPLICATE] - before[metrics.INBOX_DUPLICATE] == 2
    assert set(
        Delivery.objects.filter(consumer=emails.CONSUMER).values_list("attempts", flat=True)
    ) == {1}


def test_a_failing_send_holds_back_no_delivery_and_no_neighbour(
    make_user, rings, emails_on, monkeypatch
):
    from django.core import mail
    from django.core.mail import EmailMultiAlternatives

    shoppers = [make_user() for _ in range(3)]
    ids = [
        write(events.ORDER_CONFIRMED, order_payload(s, number=i)) for i, s in enumerate(shoppers)
    ]
    relay.relay_once()
    assert run([(EMAILS_TASK, ids)]) == ["applied:3"]  # every delivery done: the mail server
    real_send = EmailMultiAlternatives.send  # is not on the delivery path any more

    def send(self, fail_silently=False):
        if shoppers[1].email in self.to:
            raise OSError("smtp: mailbox busy")
        return real_send(self, fail_silently)

    monkeypatch.setattr(EmailMultiAlternatives, "send", send)
    assert _send_all() == "failed:1,sent:2"
    assert sorted(m.to[0] for m in mail.outbox) == sorted([shoppers[0].email, shoppers[2].email])
    failing = _mails()[ids[1]]
    assert "mailbox busy" in failing.last_error and failing.done_at is None
    assert all(r.done_at is not None and r.attempts == 1 for r in _email_rows().values())


def test_a_poison_message_in_an_emails_ring_is_a_dead_letter_alone(make_user, rings, emails_on):
    a, b = make_user(), make_user()
    good_a = write(events.ORDER_CONFIRMED, order_payload(a, number=1))
    unknown_owner = {**order_payload(a, number=2), "owner_id": 10**9}  # no user of this shop
    poison = write(events.ORDER_CONFIRMED, unknown_owner)
    unreadable = write(events.ORDER_CONFIRMED, {**order_payload(b, number=3), "owner_id": "b"})
    good_b = write(events.ORDER_CONFIRMED, order_payload(b, number=4))
    relay.relay_once()
    ring = [(EMAILS_TASK, [good_a, poison, unreadable, good_b])]
    # The batch rolls back whole, then one by one: each poison message alone is a dead letter.
    assert run(ring) == ["applied:2,dead_letter:2"]
    mails = _mails()
    assert sorted(mails) == sorted([good_a, good_b])
    assert sorted(m.address for m in mails.values()) == sorted([a.email, b.email])
    rows = _email_rows()
    for bad in (poison, unreadable):
        assert rows[bad].needs_attention and rows[bad].attempts == 1
        assert "PoisonMessage" in rows[bad].last_error
    assert [rows[m].done_at is not None and rows[m].attempts for m in (good_a, good_b)] == [1, 1]
    # A copy of the ring: the dead letters do not run again, no second row.
    assert run(ring) == ["applied:2,skipped:2"]
    assert Mail.objects.count() == 2


def test_the_send_inside_the_batch_twin_sends_the_neighbours_of_a_failing_mail_twice(
    make_user, rings, emails_on, monkeypatch
):
    # DELIBERATELY WRONG: sending inside the batch transaction (the reason sending is due
    # work now). The failure rolls the neighbours' claims back after their mails went out,
    # and the one-by-one pass sends them again.
    from django.core import mail
    from django.core.mail import EmailMultiAlternatives

    shoppers = [make_user() for _ in range(3)]
    ids = [
        write(events.ORDER_CONFIRMED, order_payload(s, number=i)) for i, s in enumerate(shoppers)
    ]
    relay.relay_once()
    real_send = EmailMultiAlternatives.send

    def send(self, fail_silently=False):
        if shoppers[1].email in self.to:
            raise OSError("smtp: mailbox busy")
        return real_send(self, fail_silently)

    monkeypatch.setattr(EmailMultiAlternatives, "send", send)

    def send_one(*, message_id, event_type, payload):
        emails.inbox_claim_many(consumer=emails.CONSUMER, message_ids=[message_id])
        owner = get_user_model().objects.get(pk=payload["owner_id"])
        EmailMultiAlternatives("x", "y", to=[owner.email]).send()

    def send_many(messages):
        return [
            send_one(message_id=m.message_id, event_type=m.event_type, payload=m.payload)
            for m in messages
        ]

    result = deliveries.deliveries_consume(
        consumer=emails.CONSUMER,
        message_ids=ids,
        apply_many=send_many,
        apply=send_one,
        atomic=True,
    )
    assert result.one_by_one
    assert sorted(m.to[0] for m in mail.outbox).count(shoppers[0].email) == 2


def test_one_emails_id_alone_takes_the_one_delivery_path(shopper, rings, emails_on):
    one = write(events.ORDER_CONFIRMED, order_payload(shopper))
    relay.relay_once()
    assert consume_emails(one) == "applied:queued"
    assert consume_emails(one) == "applied:duplicate"
    assert list(_mails()) == [one]
