import random
import threading

import pytest
from django.db import IntegrityError, transaction

from inventory import lock_objects, selectors
from inventory.models import Reservation, StockItem
from inventory.services import (
    StockBelowReserved,
    StockLimitExceeded,
    reservations_commit,
    reservations_hold,
    reservations_release,
    reservations_set_expiry,
    stock_adjust,
)
from tests.concurrency import Workers, wait_for_lock_waiters


def stock_of(sku: str) -> StockItem:
    return StockItem.objects.get(product__sku=sku)


def counters(sku: str) -> tuple[int, int]:
    stock = stock_of(sku)
    return stock.on_hand, stock.reserved


@pytest.mark.django_db
class TestHold:
    def test_exact_grants_all_or_nothing(self, make_product):
        make_product("A", stock=3)
        stock = stock_of("A")
        held = reservations_hold(requests={stock.id: 2}, partial=False)
        assert held[stock.id].quantity == 2 and held[stock.id].state == "held"
        assert reservations_hold(requests={stock.id: 2}, partial=False) == {}
        assert counters("A") == (3, 2)

    def test_partial_grants_what_is_available(self, make_product):
        make_product("A", stock=3)
        stock = stock_of("A")
        assert reservations_hold(requests={stock.id: 5}, partial=True)[stock.id].quantity == 3
        assert reservations_hold(requests={stock.id: 1}, partial=True) == {}
        assert counters("A") == (3, 3)
        assert Reservation.objects.count() == 1

    def test_several_items_in_one_call(self, make_product):
        make_product("A", stock=3)
        make_product("B", stock=0)
        make_product("C", stock=10)
        a, b, c = stock_of("A"), stock_of("B"), stock_of("C")
        held = reservations_hold(requests={c.id: 4, a.id: 5, b.id: 1}, partial=True)
        assert {k: v.quantity for k, v in held.items()} == {a.id: 3, c.id: 4}
        assert counters("A") == (3, 3) and counters("B") == (0, 0) and counters("C") == (10, 4)

    def test_several_items_exact_grants_each_all_or_nothing(self, make_product):
        """Several rows (the locked path): an item short of its quantity grants nothing."""
        make_product("A", stock=3)
        make_product("B", stock=1)
        make_product("C", stock=4)
        a, b, c = stock_of("A"), stock_of("B"), stock_of("C")
        reservations_hold(requests={c.id: 3}, partial=False)  # C: one unit left
        held = reservations_hold(requests={a.id: 3, b.id: 2, c.id: 2}, partial=False)
        assert {k: v.quantity for k, v in held.items()} == {a.id: 3}
        assert counters("A") == (3, 3) and counters("B") == (1, 0) and counters("C") == (4, 3)
        held = reservations_hold(requests={a.id: 1, c.id: 1}, partial=False)
        assert {k: v.quantity for k, v in held.items()} == {c.id: 1}
        assert counters("A") == (3, 3) and counters("C") == (4, 4)
        assert selectors.stock_drift() == []

    def test_rolled_back_hold_leaves_nothing(self, make_product):
        make_product("A", stock=3)
        stock = stock_of("A")
        with pytest.raises(RuntimeError), transaction.atomic():
            reservations_hold(requests={stock.id: 2}, partial=True)
            raise RuntimeError
        assert counters("A") == (3, 0)
        assert not Reservation.objects.exists()


@pytest.mark.django_db
class TestCommitAndRelease:
    def hold(self, sku: str, quantity: int) -> Reservation:
        stock = stock_of(sku)
        return reservations_hold(requests={stock.id: quantity}, partial=False)[stock.id]

    def test_commit_moves_units_out_of_on_hand_and_reserved_once(self, make_product):
        make_product("A", stock=5)
        flag = self.hold("A", 2)
        assert reservations_commit(reservation_ids=[flag.id]) == 1
        assert counters("A") == (3, 0)
        assert reservations_commit(reservation_ids=[flag.id]) == 0
        assert counters("A") == (3, 0)
        flag.refresh_from_db()
        assert flag.state == "committed" and flag.resolved_at is not None

    def test_release_resets_the_flag_once(self, make_product):
        make_product("A", stock=5)
        flag = self.hold("A", 2)
        assert reservations_release(reservation_ids=[flag.id]) == 1
        assert reservations_release(reservation_ids=[flag.id]) == 0
        assert counters("A") == (5, 0)
        flag.refresh_from_db()
        assert flag.state == "released"

    def test_commit_after_release_and_release_after_commit_do_nothing(self, make_product):
        make_product("A", stock=5)
        released, committed = self.hold("A", 1), self.hold("A", 2)
        reservations_release(reservation_ids=[released.id])
        reservations_commit(reservation_ids=[committed.id])
        assert reservations_commit(reservation_ids=[released.id]) == 0
        assert reservations_release(reservation_ids=[committed.id]) == 0
        assert reservations_release(reservation_ids=[committed.id], state="expired") == 0
        assert counters("A") == (3, 0)

    def test_expire_marks_expired(self, make_product):
        make_product("A", stock=5)
        flag = self.hold("A", 2)
        assert reservations_release(reservation_ids=[flag.id], state="expired") == 1
        flag.refresh_from_db()
        assert flag.state == "expired" and counters("A") == (5, 0)

    def test_set_expiry_only_touches_held_flags(self, make_product):
        from django.utils import timezone

        make_product("A", stock=5)
        held, done = self.hold("A", 1), self.hold("A", 1)
        reservations_commit(reservation_ids=[done.id])
        when = timezone.now()
        assert reservations_set_expiry(reservation_ids=[held.id, done.id], expires_at=when) == 1
        assert reservations_set_expiry(reservation_ids=[held.id], expires_at=None) == 1
        held.refresh_from_db()
        assert held.expires_at is None

    def test_resolved_at_must_match_state(self, make_product):
        make_product("A", stock=5)
        flag = self.hold("A", 1)
        with pytest.raises(IntegrityError) as info, transaction.atomic():
            Reservation.objects.filter(id=flag.id).update(state="committed")
        assert "inventory_reservation_resolved_at_matches_state" in str(info.value)

    def test_drift_is_empty_when_books_balance(self, make_product):
        make_product("A", stock=5)
        self.hold("A", 2)
        assert selectors.stock_drift() == []
        StockItem.objects.filter(product__sku="A").update(reserved=3)
        assert [row["product__sku"] for row in selectors.stock_drift()] == ["A"]


@pytest.mark.django_db
class TestStockAdjust:
    def test_delta_and_set(self, make_product):
        make_product("A", stock=5)
        assert stock_adjust(sku="A", delta=3).on_hand == 8
        assert stock_adjust(sku="A", delta=-8).on_hand == 0
        assert stock_adjust(sku="A", set_to=7).on_hand == 7

    def test_never_below_reserved(self, make_product):
        make_product("A", stock=5)
        stock = stock_of("A")
        reservations_hold(requests={stock.id: 4}, partial=False)
        with pytest.raises(StockBelowReserved) as info:
            stock_adjust(sku="A", delta=-2)
        assert info.value.extra == {"on_hand": 5, "reserved": 4, "requested": 3}
        with pytest.raises(StockBelowReserved):
            stock_adjust(sku="A", set_to=3)
        assert stock_adjust(sku="A", set_to=4).on_hand == 4
        assert counters("A") == (4, 4)

    def test_limit(self, make_product):
        make_product("A", stock=999_999_999)
        with pytest.raises(StockLimitExceeded):
            stock_adjust(sku="A", delta=2)
        assert counters("A") == (999_999_999, 0)


@pytest.mark.django_db(transaction=True)
def test_adjust_waits_for_a_concurrent_reservation_and_respects_it(make_product):
    """The condition lives in the UPDATE: an adjust queued behind a reservation sees it."""
    make_product("A", stock=5)
    stock = stock_of("A")
    workers = Workers()
    with transaction.atomic():
        reservations_hold(requests={stock.id: 4}, partial=False)
        workers.start(stock_adjust, sku="A", delta=-3)
        wait_for_lock_waiters(1)
    with pytest.raises(StockBelowReserved):
        workers.join()
    assert counters("A") == (5, 4)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("partial", [False, True], ids=["exact", "partial"])
def test_many_concurrent_reservers_never_oversell(make_product, partial):
    """50 units, 6 threads each trying 20 reservations: exactly 50 units granted.

    The main transaction holds the stock row while every worker queues on it,
    so all of them are proven to contend for the same row at once.
    """
    make_product("HOT", stock=50)
    stock = stock_of("HOT")
    threads, attempts = 6, 20
    barrier = threading.Barrier(threads + 1)
    granted: list[int] = []
    guard = threading.Lock()

    def reserver(seed: int) -> None:
        rng = random.Random(seed)
        barrier.wait()
        for _ in range(attempts):
            quantity = rng.randint(1, 3) if partial else 1
            with transaction.atomic():
                held = reservations_hold(requests={stock.id: quantity}, partial=partial)
            with guard:
                granted.append(held[stock.id].quantity if held else 0)

    workers = Workers()
    with transaction.atomic():
        lock_objects.stock_items_lock(stock_ids=[stock.id])
        for seed in range(threads):
            workers.start(reserver, seed)
        barrier.wait()
        assert wait_for_lock_waiters(threads) >= threads
    workers.join()

    assert sum(granted) == 50
    assert len(granted) == threads * attempts
    assert counters("HOT") == (50, 50)
    assert sum(r.quantity for r in Reservation.objects.filter(state="held")) == 50
    assert selectors.stock_drift() == []

    # Committing every flag, each twice and from several threads, sells 50 once.
    ids = list(Reservation.objects.values_list("id", flat=True))
    barrier = threading.Barrier(threads)

    def committer() -> None:
        barrier.wait()
        reservations_commit(reservation_ids=ids)

    workers = Workers()
    for _ in range(threads):
        workers.start(committer)
    workers.join()
    assert counters("HOT") == (0, 0)
    assert Reservation.objects.filter(state="committed").count() == len(ids)
