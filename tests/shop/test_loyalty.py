"""Loyalty points: each event once, by a versioned conditional UPDATE and the applied ids."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.conf import settings
from django.db import connection, transaction

from idempotency import metrics
from shop import events, loyalty
from shop.events import PoisonMessage
from shop.models import LoyaltyAccount
from tests.concurrency import Workers

pytestmark = pytest.mark.django_db(transaction=True)

DUPLICATES = "shop_duplicates_suppressed_total"
PROCESSED_ID = 'mechanism="processed_id"'


def order_payload(user, *, order_id=None, lines=(("TEE-M", 2, "19.99"),), number=1):
    return {
        "order_id": order_id or str(uuid.uuid4()),
        "number": number,
        "owner_id": user.pk,
        "status": "confirmed",
        "total": "0.00",
        "currency": "EUR",
        "lines": [
            {
                "sku": sku,
                "quantity_requested": max(qc, 1),
                "quantity_confirmed": qc,
                "unit_price": price,
                "status": "confirmed" if qc else "unavailable",
            }
            for sku, qc, price in lines
        ],
    }


def return_payload(user, *, order_id, lines):
    return {
        "order_id": order_id,
        "number": 1,
        "owner_id": user.pk,
        "return_id": str(uuid.uuid4()),
        "lines": [{"sku": s, "quantity": q, "unit_price": p} for s, q, p in lines],
    }


def apply(event_type, payload, event_id=None):
    return loyalty.loyalty_apply(
        event_id=event_id or str(uuid.uuid4()), event_type=event_type, payload=payload
    )


def balance_of(user) -> int:
    return LoyaltyAccount.objects.get(user=user).balance


def duplicates_counted() -> int:
    return metrics.duplicate_totals()[metrics.PROCESSED_ID]


# --- the contract's rules ------------------------------------------------------


def test_confirmed_lines_earn_floor_of_unit_price_times_quantity_confirmed(shopper):
    payload = order_payload(
        shopper, lines=[("TEE-M", 2, "19.99"), ("CAP", 3, "5.50"), ("MUG", 0, "9.00")]
    )
    result = apply(events.ORDER_PARTIALLY_CONFIRMED, payload)
    assert (result.outcome, result.points, result.balance, result.version) == (
        "applied",
        19 * 2 + 5 * 3,
        53,
        1,
    )
    assert balance_of(shopper) == 53


def test_a_returned_unit_reverses_floor_of_unit_price_and_cancel_reverses_what_is_left(shopper):
    order_id = str(uuid.uuid4())
    apply(
        events.ORDER_CONFIRMED,
        order_payload(
            shopper, order_id=order_id, lines=[("TEE-M", 2, "19.99"), ("CAP", 3, "5.50")]
        ),
    )
    returned = apply(
        events.RETURN_COMPLETED,
        return_payload(shopper, order_id=order_id, lines=[("TEE-M", 1, "19.99")]),
    )
    assert (returned.points, balance_of(shopper)) == (-19, 34)
    cancelled = apply(events.ORDER_CANCELLED, order_payload(shopper, order_id=order_id))
    assert (cancelled.points, balance_of(shopper)) == (-34, 0)
    # A second cancellation event (another id) has nothing left to reverse.
    assert apply(events.ORDER_CANCELLED, order_payload(shopper, order_id=order_id)).points == 0
    assert balance_of(shopper) == 0


def test_cancellation_touches_only_its_own_order(shopper):
    kept, cancelled = str(uuid.uuid4()), str(uuid.uuid4())
    apply(events.ORDER_CONFIRMED, order_payload(shopper, order_id=kept, lines=[("A", 1, "10.00")]))
    apply(events.ORDER_CONFIRMED, order_payload(shopper, order_id=cancelled, lines=[("B", 1, "7")]))
    apply(events.ORDER_CANCELLED, order_payload(shopper, order_id=cancelled))
    assert balance_of(shopper) == 10


def test_a_confirmation_delivered_after_its_cancellation_earns_nothing(shopper):
    order_id = str(uuid.uuid4())
    apply(events.ORDER_CANCELLED, order_payload(shopper, order_id=order_id))
    late = apply(events.ORDER_CONFIRMED, order_payload(shopper, order_id=order_id))
    assert (late.outcome, late.points, balance_of(shopper)) == ("applied", 0, 0)


def test_a_return_delivered_before_its_confirmation_nets_out(shopper):
    order_id = str(uuid.uuid4())
    apply(
        events.RETURN_COMPLETED,
        return_payload(shopper, order_id=order_id, lines=[("TEE-M", 1, "19.99")]),
    )
    apply(events.ORDER_CONFIRMED, order_payload(shopper, order_id=order_id))
    assert balance_of(shopper) == 19


def test_a_second_earning_event_for_one_order_earns_nothing(shopper):
    order_id = str(uuid.uuid4())
    apply(events.ORDER_CONFIRMED, order_payload(shopper, order_id=order_id))
    again = apply(events.ORDER_PARTIALLY_CONFIRMED, order_payload(shopper, order_id=order_id))
    assert (again.points, balance_of(shopper)) == (0, 38)


# --- duplicates -----------------------------------------------------------------


def test_the_same_event_twice_applies_once_and_is_counted(shopper):
    payload = order_payload(shopper)
    before = duplicates_counted()
    first = apply(events.ORDER_CONFIRMED, payload, event_id="evt-1")
    second = apply(events.ORDER_CONFIRMED, payload, event_id="evt-1")
    assert (first.outcome, second.outcome) == ("applied", "duplicate")
    assert (second.balance, second.version) == (38, 1)
    account = LoyaltyAccount.objects.get(user=shopper)
    assert (account.balance, account.version) == (38, 1)
    assert [entry["id"] for entry in account.applied] == ["evt-1"]
    assert duplicates_counted() == before + 1


def test_other_event_types_are_ignored_and_make_no_account(shopper):
    for event_type in ("order.expired", "order.payment_failed", "order.awaiting_decision", "x"):
        assert apply(event_type, {"anything": True}).outcome == "ignored"
    assert not LoyaltyAccount.objects.filter(user=shopper).exists()


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p.pop("lines"),
        lambda p: p.pop("owner_id"),
        lambda p: p.update(owner_id="7"),
        lambda p: p.update(number=True),
        lambda p: p.update(lines="TEE-M"),
        lambda p: p["lines"][0].update(unit_price="abc"),
        lambda p: p["lines"][0].update(unit_price="NaN"),
        lambda p: p["lines"][0].update(unit_price=19.99),
        lambda p: p["lines"][0].update(quantity_confirmed=-1),
        lambda p: p["lines"][0].pop("sku"),
        lambda p: p.update(owner_id=10**9),  # no such user
    ],
)
def test_a_payload_that_does_not_parse_is_poison_and_changes_nothing(shopper, change):
    payload = order_payload(shopper)
    change(payload)
    with pytest.raises(PoisonMessage):
        apply(events.ORDER_CONFIRMED, payload)
    assert not LoyaltyAccount.objects.filter(balance__gt=0).exists()


def test_a_payload_that_is_not_an_object_is_poison():
    with pytest.raises(PoisonMessage):
        apply(events.ORDER_CANCELLED, ["not", "an", "object"])
    with pytest.raises(PoisonMessage):
        loyalty.loyalty_apply(event_id="", event_type=events.ORDER_CANCELLED, payload={})


def test_poison_is_not_retryable_and_a_conflict_is():
    assert PoisonMessage.retryable is False
    assert loyalty.LoyaltyConflict.retryable is True


def test_the_account_is_made_insert_first_once_for_many_concurrent_first_events(make_user):
    shopper = make_user()
    barrier = threading.Barrier(6)
    workers = Workers()

    def first_event():
        barrier.wait()
        loyalty._ensure_account(shopper.pk)

    for _ in range(6):
        workers.start(first_event)
    workers.join()
    assert LoyaltyAccount.objects.filter(user=shopper).count() == 1


def test_after_every_try_lost_the_error_is_retryable(shopper, monkeypatch):
    monkeypatch.setattr(loyalty, "_update", lambda **kwargs: None)
    monkeypatch.setattr(loyalty.time, "sleep", lambda seconds: None)
    with pytest.raises(loyalty.LoyaltyConflict):
        apply(events.ORDER_CONFIRMED, order_payload(shopper))
    assert balance_of(shopper) == 0


# --- races ----------------------------------------------------------------------


def _read_then_meet(monkeypatch, parties: int):
    """Make every thread's first read of the account happen before any thread writes.

    Each thread's first `_read` waits at a barrier after reading, so all of
    them read the same version: every write after the first is a real
    conflict. Return a list that collects the tries that lost.
    """
    barrier = threading.Barrier(parties)
    local = threading.local()
    real_read, real_update = loyalty._read, loyalty._update
    lost: list[int] = []

    def read(user_id, event_id):
        row = real_read(user_id, event_id)
        if not getattr(local, "met", False):
            local.met = True
            barrier.wait(timeout=30)
        return row

    def update(**kwargs):
        new_version = real_update(**kwargs)
        if new_version is None:
            lost.append(kwargs["version"])
        return new_version

    monkeypatch.setattr(loyalty, "_read", read)
    monkeypatch.setattr(loyalty, "_update", update)
    return lost


def test_concurrent_events_for_one_account_lose_no_update(make_user, monkeypatch):
    shopper = make_user()
    loyalty._ensure_account(shopper.pk)
    # 6 distinct events, two of them sent twice more: 8 threads at once.
    distinct = [
        (f"evt-{i}", order_payload(shopper, lines=[("SKU", i + 1, f"{10 * (i + 1)}.50")]))
        for i in range(6)
    ]
    sends = [*distinct, distinct[0], distinct[3]]
    expected = sum(10 * (i + 1) * (i + 1) for i in range(6))
    lost = _read_then_meet(monkeypatch, parties=len(sends))
    connection.close()  # the pool holds 8 connections: give this thread's back
    workers = Workers()
    for event_id, payload in sends:
        workers.start(apply, events.ORDER_CONFIRMED, payload, event_id)
    results = workers.join()

    applied = [r for r in results if r.outcome == "applied"]
    assert len(applied) == 6
    assert sum(r.outcome == "duplicate" for r in results) == 2
    # Each successful UPDATE made its own version: 1..6, none shared, none skipped.
    assert sorted(r.version for r in applied) == list(range(1, 7))
    account = LoyaltyAccount.objects.get(user=shopper)
    assert (account.balance, account.version) == (expected, 6)
    assert sorted(entry["id"] for entry in account.applied) == sorted(e for e, _ in distinct)
    # The overlap was real: all 8 first read version 0, so 7 lost that first try.
    assert lost.count(0) == len(sends) - 1


def test_the_same_event_from_two_threads_at_once_applies_once(make_user, monkeypatch):
    shopper = make_user()
    loyalty._ensure_account(shopper.pk)
    lost = _read_then_meet(monkeypatch, parties=2)
    payload = order_payload(shopper)
    workers = Workers()
    for _ in range(2):
        workers.start(apply, events.ORDER_CONFIRMED, payload, "evt-same")
    results = workers.join()
    assert sorted(r.outcome for r in results) == ["applied", "duplicate"]
    assert lost == [0]
    account = LoyaltyAccount.objects.get(user=shopper)
    assert (account.balance, account.version) == (38, 1)


def _twin_apply(user_id: int, points: int, meet: threading.Barrier) -> None:
    """The wrong way, kept to show what the version guard prevents: read, add, save."""
    with transaction.atomic():
        account = LoyaltyAccount.objects.get(user_id=user_id)
        meet.wait(timeout=30)  # every twin has read before any writes
        account.balance += points
        account.save(update_fields=["balance"])


def test_the_read_modify_write_twin_loses_updates(make_user):
    shopper = make_user()
    loyalty._ensure_account(shopper.pk)
    barrier = threading.Barrier(8)
    connection.close()  # the pool holds 8 connections: give this thread's back
    workers = Workers()
    for i in range(8):
        workers.start(_twin_apply, shopper.pk, 10 + i, barrier)
    workers.join()
    # Eight additions, but each saved what it read plus its own: only one survives.
    assert balance_of(shopper) < sum(10 + i for i in range(8))
    assert balance_of(shopper) in {10 + i for i in range(8)}


# --- trimming the applied ids by age --------------------------------------------


def _seed_applied(user, entries: list[tuple[str, float]]) -> None:
    """Give the account applied ids aged `seconds` before now on the database clock."""
    loyalty._ensure_account(user.pk)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE shop_loyaltyaccount SET applied = ("
            "  SELECT jsonb_agg(jsonb_build_object('id', e.id, "
            "    'at', now() - make_interval(secs => e.age)) ORDER BY e.n) "
            "  FROM unnest(%s::text[], %s::float8[]) WITH ORDINALITY AS e(id, age, n)"
            ") WHERE user_id = %s",
            [[i for i, _ in entries], [a for _, a in entries], user.pk],
        )


def test_trimming_drops_ids_older_than_the_retention_and_keeps_younger_ones(shopper):
    retention = settings.LOYALTY_APPLIED_IDS_RETENTION
    _seed_applied(shopper, [("old", retention + 3600), ("young", retention - 3600)])
    apply(events.ORDER_CONFIRMED, order_payload(shopper), event_id="new")
    ids = [entry["id"] for entry in LoyaltyAccount.objects.get(user=shopper).applied]
    assert ids == ["young", "new"]
    # What the retention is for: a copy of a younger event is still refused ...
    assert apply(events.ORDER_CONFIRMED, order_payload(shopper), event_id="young").outcome == (
        "duplicate"
    )
    # ... while a copy arriving after its id was forgotten would apply again.
    assert apply(events.ORDER_CANCELLED, order_payload(shopper), event_id="old").outcome == (
        "applied"
    )


def test_trimming_is_by_age_never_by_count(shopper):
    many = [(f"evt-{i}", 60.0) for i in range(2000)]
    _seed_applied(shopper, many)
    apply(events.ORDER_CONFIRMED, order_payload(shopper), event_id="new")
    assert len(LoyaltyAccount.objects.get(user=shopper).applied) == 2001


# --- the API ----------------------------------------------------------------------


def test_api_shows_zero_before_the_first_event(shopper_client):
    response = shopper_client.get("/api/v1/loyalty/")
    assert response.status_code == 200
    assert response.json() == {"balance": 0, "version": 0}


def test_api_shows_the_callers_own_balance_only(shopper, shopper_client, make_user, client_for):
    apply(events.ORDER_CONFIRMED, order_payload(shopper))
    apply(events.ORDER_CONFIRMED, order_payload(shopper, lines=[("CAP", 1, "5.00")]))
    assert shopper_client.get("/api/v1/loyalty/").json() == {"balance": 43, "version": 2}
    other = client_for(make_user())
    assert other.get("/api/v1/loyalty/").json() == {"balance": 0, "version": 0}


def test_api_needs_authentication(api_client):
    response = api_client.get("/api/v1/loyalty/")
    assert response.status_code == 401
