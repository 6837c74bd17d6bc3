"""The consumer tasks: one effect per consumer per message, however often it is delivered.

In-process: the relay's publish is captured (no broker), the tasks are run
directly with the ids it would have published. Real processes (worker,
relay, broker loss) are in tests/idempotency/test_relay.py.
"""

from __future__ import annotations

import re
import threading
import uuid

import pytest
from django.db import transaction
from django.db.models.functions import Now

from idempotency import metrics
from idempotency.messaging import relay
from idempotency.messaging.deliveries import dead_letter_requeue, dead_letters_count
from idempotency.messaging.outbox import outbox_write
from idempotency.models import Delivery, OutboxMessage
from shop import events, history, loyalty
from shop.models import LoyaltyAccount, PurchaseHistoryLine
from shop.tasks import consume_history, consume_loyalty
from tests.shop.test_history import order_payload

pytestmark = pytest.mark.django_db(transaction=True)

TASKS = {"shop.consume_loyalty": consume_loyalty, "shop.consume_history": consume_history}


@pytest.fixture
def published(monkeypatch):
    """Capture what the relay publishes: a list of (task name, message id)."""
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(relay, "publish", lambda pairs: sent.extend(pairs))
    return sent


def write(event_type, payload) -> str:
    with transaction.atomic():
        message = outbox_write(
            aggregate_type="order",
            aggregate_id=payload.get("order_id", "x"),
            event_type=event_type,
            payload=payload,
        )
    return str(message.id)


def run(pairs) -> list[str]:
    return [TASKS[name](message_id) for name, message_id in pairs]


def duplicates() -> dict[str, int]:
    """Suppressed duplicates so far, by mechanism (the database counts /metrics shows)."""
    return metrics.duplicate_totals()


def balance(user) -> int:
    return LoyaltyAccount.objects.filter(user_id=user.pk).values_list("balance", flat=True).first()


def history_quantity(user) -> int:
    return sum(
        PurchaseHistoryLine.objects.filter(user_id=user.pk).values_list("quantity", flat=True)
    )


def test_a_message_delivered_twice_has_one_effect_per_consumer_and_counts_the_copy(
    shopper, published
):
    write(events.ORDER_CONFIRMED, order_payload(shopper))  # 2 x 19.99 -> 38 points
    before = duplicates()
    assert relay.relay_once() == 1
    assert sorted(name for name, _ in published) == sorted(TASKS)
    first = run(published)
    second = run(published)  # the same ids again: a redelivery
    assert first == ["applied:applied", "applied:applied"]
    assert second == ["applied:duplicate", "applied:duplicate"]
    assert balance(shopper) == 38 and history_quantity(shopper) == 2
    after = duplicates()
    assert after[metrics.INBOX_DUPLICATE] - before[metrics.INBOX_DUPLICATE] == 1
    assert after[metrics.PROCESSED_ID] - before[metrics.PROCESSED_ID] == 1
    assert Delivery.objects.filter(done_at__isnull=False).count() == 2
    assert OutboxMessage.objects.get().done_at is not None


def test_a_message_delivered_twice_at_once_has_one_effect_per_consumer(
    shopper, published, monkeypatch
):
    write(events.ORDER_CONFIRMED, order_payload(shopper))
    relay.relay_once()
    before = duplicates()
    barrier = threading.Barrier(2, timeout=20)
    real_history, real_loyalty = history.history_apply, loyalty.loyalty_apply

    def history_at_once(**kwargs):
        barrier.wait()
        return real_history(**kwargs)

    def loyalty_at_once(**kwargs):
        barrier.wait()
        return real_loyalty(**kwargs)

    monkeypatch.setattr(history, "history_apply", history_at_once)
    monkeypatch.setattr(loyalty, "loyalty_apply", loyalty_at_once)
    for name, message_id in published:
        results: list[str] = []

        def deliver(name=name, message_id=message_id, results=results):
            from django.db import connection

            try:
                results.append(TASKS[name](message_id))
            finally:
                connection.close()

        threads = [threading.Thread(target=deliver) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(results) == ["applied:applied", "applied:duplicate"], name
    assert balance(shopper) == 38 and history_quantity(shopper) == 2
    after = duplicates()
    for mechanism in (metrics.INBOX_DUPLICATE, metrics.PROCESSED_ID):
        assert after[mechanism] - before[mechanism] == 1, mechanism
    # Both copies counted an attempt in the database.
    assert list(Delivery.objects.values_list("attempts", flat=True)) == [2, 2]


def test_poison_is_a_dead_letter_at_once_and_requeue_after_the_fix_applies_once(shopper, published):
    payload = order_payload(shopper)
    payload["lines"][0]["unit_price"] = "not a price"
    message_id = write(events.ORDER_CONFIRMED, payload)
    relay.relay_once()
    assert run(published) == ["dead_letter:", "dead_letter:"]
    dead = Delivery.objects.filter(needs_attention=True)
    assert dead.count() == 2 and dead_letters_count() == 2
    assert all("PoisonMessage" in d.last_error and "unit_price" in d.last_error for d in dead)
    assert all(d.attempts == 1 for d in dead)
    # A copy of a dead letter does not run again (no loop).
    assert run(published) == ["skipped:", "skipped:"]
    assert balance(shopper) in (None, 0) and history_quantity(shopper) == 0

    # The producer is fixed; staff requeue: published again, applied once.
    payload["lines"][0]["unit_price"] = "19.99"
    OutboxMessage.objects.filter(pk=message_id).update(payload=payload)
    published.clear()
    with transaction.atomic():
        assert all(dead_letter_requeue(pk) for pk in dead.values_list("pk", flat=True))
    assert sorted(name for name, _ in published) == sorted(TASKS)
    assert run(published) == ["applied:applied", "applied:applied"]
    assert run(published) == ["applied:duplicate", "applied:duplicate"]
    assert balance(shopper) == 38 and history_quantity(shopper) == 2
    assert dead_letters_count() == 0


def test_a_consumer_that_raises_is_retried_with_backoff_then_a_dead_letter(
    shopper, published, monkeypatch, settings
):
    settings.OUTBOX_DELIVERY_MAX_ATTEMPTS = 3
    write(events.ORDER_CONFIRMED, order_payload(shopper))
    relay.relay_once()

    def broken(**kwargs):
        raise events.RetryableConsumerError("the read model is being rebuilt")

    monkeypatch.setattr(history, "history_apply", broken)
    history_pair = [p for p in published if p[0] == "shop.consume_history"]
    results = []
    for _ in range(3):
        Delivery.objects.filter(consumer="purchase_history").update(
            next_attempt_at=Now(), lease_expires_at=None
        )
        results += run(history_pair)
        row = Delivery.objects.get(consumer="purchase_history")
        if not row.needs_attention:
            # Due again only after the backoff, and free for the sweeper then.
            assert row.lease_expires_at is None
            assert row.next_attempt_at > OutboxMessage.objects.get().created_at
    assert results == ["failed:", "failed:", "dead_letter:"]
    row = Delivery.objects.get(consumer="purchase_history")
    assert row.needs_attention and row.attempts == 3
    assert "attempt budget spent (3 attempts)" in row.last_error
    assert "being rebuilt" in row.last_error
    # The other consumer is not held back.
    assert run([p for p in published if p[0] == "shop.consume_loyalty"]) == ["applied:applied"]


def test_a_delivery_whose_attempts_killed_the_worker_stops_at_the_budget(
    shopper, published, settings
):
    # A worker killed mid-task leaves the counted attempt behind; Celery's own
    # retry count would restart at 0 on the redelivery, the row's does not.
    settings.OUTBOX_DELIVERY_MAX_ATTEMPTS = 2
    write(events.ORDER_CONFIRMED, order_payload(shopper))
    relay.relay_once()
    Delivery.objects.update(attempts=2)  # two runs died mid-task
    assert run(published) == ["dead_letter:", "dead_letter:"]
    assert all(
        "attempt budget spent" in e for e in Delivery.objects.values_list("last_error", flat=True)
    )
    assert history_quantity(shopper) == 0


def test_unknown_types_are_acknowledged_and_ignored_and_bad_ids_skipped(shopper, published):
    write("order.expired", {"order_id": str(uuid.uuid4())})
    write("something.new", {"anything": 1})
    assert relay.relay_once() == 2
    assert published == [] and not Delivery.objects.exists()
    assert OutboxMessage.objects.filter(done_at__isnull=True).count() == 0
    # A message id that is no uuid, or no message: acknowledged, no crash.
    assert consume_history("not-a-uuid") == "skipped:"
    assert consume_loyalty(str(uuid.uuid4())) == "skipped:"


def test_the_sweeper_publishes_again_what_was_not_applied_in_time(shopper, published, settings):
    write(events.ORDER_CONFIRMED, order_payload(shopper))
    relay.relay_once()
    published.clear()
    assert relay.deliveries_sweep() == 0  # leased for the delivery timeout
    Delivery.objects.update(lease_expires_at=Now())  # the timeout passes, nothing applied
    assert relay.deliveries_sweep() == 2
    assert sorted(n for n, _ in published) == sorted(TASKS)
    assert set(Delivery.objects.values_list("publishes", flat=True)) == {2}
    run(published)
    published.clear()
    Delivery.objects.update(lease_expires_at=Now())
    assert relay.deliveries_sweep() == 0  # done deliveries are never published again


def test_dead_letters_admin_lists_them_and_requeue_publishes(shopper, published, client, make_user):
    payload = order_payload(shopper)
    payload["owner_id"] = 987654321  # no such user
    message_id = write(events.ORDER_CONFIRMED, payload)
    relay.relay_once()
    run(published)
    staff = make_user(staff=True)
    staff.is_superuser = True
    staff.save()
    client.force_login(staff)
    page = client.get("/admin/idempotency/deadletter/")
    assert page.status_code == 200
    assert message_id in page.content.decode() and "not a user" in page.content.decode()
    assert "Requeue" in page.content.decode()
    payload["owner_id"] = shopper.pk
    OutboxMessage.objects.filter(pk=message_id).update(payload=payload)
    published.clear()
    action = {
        "action": "retry_now",
        "_selected_action": list(Delivery.objects.values_list("pk", flat=True)),
    }
    confirm = client.post("/admin/idempotency/deadletter/", action)
    assert confirm.status_code == 200 and not published  # only asked
    key = re.search(r'name="idempotency_key" value="([^"]+)"', confirm.content.decode())[1]
    for _ in range(2):  # a double click on "Requeue": the second is a replay
        response = client.post(
            "/admin/idempotency/deadletter/", {**action, "confirm": "yes", "idempotency_key": key}
        )
        assert response.status_code == 303
    assert response["Idempotent-Replayed"] == "true"
    assert sorted(n for n, _ in published) == sorted(TASKS)
    assert run(published) == ["applied:applied", "applied:applied"]
    assert balance(shopper) == 38 and dead_letters_count() == 0


def test_purge_deletes_old_published_messages_whose_deliveries_are_done(
    shopper, published, settings
):
    done_id = write(events.ORDER_CONFIRMED, order_payload(shopper))
    relay.relay_once()
    run(published)
    payload = order_payload(shopper)
    payload["owner_id"] = 987654321
    dead_id = write(events.ORDER_CONFIRMED, payload)
    published.clear()
    relay.relay_once()
    run(published)  # dead letters: kept for staff
    settings.OUTBOX_RETENTION = 0.0
    assert relay.outbox_purge(batch=1) == 1
    assert list(OutboxMessage.objects.values_list("pk", flat=True)) == [uuid.UUID(dead_id)]
    assert not Delivery.objects.filter(message_id=done_id).exists()
