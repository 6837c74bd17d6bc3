import random
import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now

from inventory import selectors as inventory_selectors
from inventory.models import Product, Reservation, StockItem
from orders.models import Order, OrderEvent, OrderLine
from orders.services import (
    InsufficientStock,
    InvalidState,
    OrderShipped,
    PaymentPending,
    PriceChanged,
    order_cancel,
    order_decide_confirm,
    order_expire,
    order_payment_apply,
    order_payment_record,
    order_payment_settled,
    order_payment_start,
    orders_expire_due,
)
from payments.capture import payment_create
from payments.models import Payment
from tests.concurrency import Workers, wait_for_lock_waiters, wait_until


def counters(sku: str) -> tuple[int, int]:
    stock = StockItem.objects.get(product__sku=sku)
    return stock.on_hand, stock.reserved


def lines_of(order: Order) -> list[tuple]:
    return list(
        order.lines.order_by("position").values_list(
            "sku", "quantity_requested", "quantity_confirmed", "status"
        )
    )


def make_due(order: Order) -> None:
    Order.objects.filter(id=order.id).update(reservation_expires_at=Now() - timedelta(seconds=1))


def books_balance() -> None:
    assert inventory_selectors.stock_drift() == []


@pytest.fixture
def stock(make_product):
    make_product("TEE-M", price="19.99", stock=5)
    make_product("MUG", price="7.50", stock=2)
    make_product("CAP", price="12.00", stock=0)


@pytest.mark.django_db
class TestReserve:
    @pytest.mark.parametrize("mode", ["reject", "partial", "ask"])
    def test_fully_reservable_goes_to_payment_in_every_mode(self, stock, reserve, mode):
        order = reserve({"TEE-M": 2, "MUG": 1}, on_shortage=mode)
        assert order.status == "payment_pending"
        assert order.total == Decimal("47.48")
        assert order.reservation_expires_at is None
        assert lines_of(order) == [("TEE-M", 2, 2, "reserved"), ("MUG", 1, 1, "reserved")]
        assert counters("TEE-M") == (5, 2) and counters("MUG") == (2, 1)
        assert all(r.state == "held" and r.expires_at is None for r in Reservation.objects.all())
        books_balance()

    @pytest.mark.parametrize("mode", ["reject", "partial", "ask"])
    def test_nothing_reservable_is_409_and_keeps_nothing_in_every_mode(self, stock, reserve, mode):
        with pytest.raises(InsufficientStock) as info:
            reserve({"CAP": 1}, on_shortage=mode)
        assert info.value.errors == {
            "lines": [{"index": 0, "sku": "CAP", "requested": 1, "available": 0}]
        }
        assert not Order.objects.exists() and not Reservation.objects.exists()

    def test_reject_with_a_shortage_resets_every_flag(self, stock, reserve):
        with pytest.raises(InsufficientStock) as info:
            reserve({"TEE-M": 2, "MUG": 3, "CAP": 1}, on_shortage="reject")
        assert info.value.status == 409
        assert info.value.errors == {
            "lines": [
                {"index": 1, "sku": "MUG", "requested": 3, "available": 2},
                {"index": 2, "sku": "CAP", "requested": 1, "available": 0},
            ]
        }
        assert counters("TEE-M") == (5, 0) and counters("MUG") == (2, 0)
        assert not Order.objects.exists() and not Reservation.objects.exists()

    def test_partial_holds_what_is_available(self, stock, reserve):
        order = reserve({"TEE-M": 2, "MUG": 3, "CAP": 1}, on_shortage="partial")
        assert order.status == "payment_pending"
        assert lines_of(order) == [
            ("TEE-M", 2, 2, "reserved"),
            ("MUG", 3, 2, "reserved"),
            ("CAP", 1, 0, "unavailable"),
        ]
        assert order.total == Decimal("54.98")
        assert order.lines.get(sku="CAP").reservation is None
        assert counters("MUG") == (2, 2)
        books_balance()

    def test_ask_awaits_the_decision_until_a_database_clock_deadline(
        self, stock, reserve, settings
    ):
        order = reserve({"TEE-M": 1, "MUG": 3}, on_shortage="ask")
        assert order.status == "awaiting_decision"
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            now = cursor.fetchone()[0]
        ttl = timedelta(seconds=settings.ORDER_RESERVATION_TTL_SECONDS)
        assert now + ttl - timedelta(seconds=5) <= order.reservation_expires_at <= now + ttl
        assert {r.expires_at for r in Reservation.objects.all()} == {order.reservation_expires_at}
        assert lines_of(order) == [("TEE-M", 1, 1, "reserved"), ("MUG", 3, 2, "reserved")]

    def test_expected_total_mismatch_is_409_price_changed_with_nothing_reserved(
        self, stock, reserve
    ):
        with pytest.raises(PriceChanged) as info:
            reserve({"TEE-M": 2}, expected_total=Decimal("39.97"))
        assert info.value.extra["total"] == "39.98"
        assert counters("TEE-M") == (5, 0) and not Order.objects.exists()
        assert reserve({"TEE-M": 2}, expected_total=Decimal("39.98")).total == Decimal("39.98")

    def test_prices_are_snapshotted_on_lines(self, stock, reserve):
        order = reserve({"TEE-M": 1})
        Product.objects.filter(sku="TEE-M").update(price=Decimal("99.00"))
        assert order.lines.get().unit_price == Decimal("19.99")

    def test_numbers_come_from_the_sequence_and_are_never_reused(self, stock, reserve):
        first = reserve({"TEE-M": 1})
        with pytest.raises(RuntimeError), transaction.atomic():
            reserve({"TEE-M": 1})
            raise RuntimeError
        second = reserve({"TEE-M": 1})
        assert first.number >= 100001
        assert second.number == first.number + 2

    def test_placing_writes_events_for_the_order_and_each_line(self, stock, reserve):
        order = reserve({"TEE-M": 1, "CAP": 2}, on_shortage="partial")
        events = list(
            OrderEvent.objects.filter(order=order)
            .order_by("id")
            .values_list("kind", "line__sku", "from_status", "to_status")
        )
        assert events == [
            ("placed", None, None, "payment_pending"),
            ("placed", "TEE-M", None, "reserved"),
            ("placed", "CAP", None, "unavailable"),
        ]


@pytest.mark.django_db
class TestPaymentRecord:
    def test_captured_confirms_and_sells_once(self, stock, reserve):
        order = reserve({"TEE-M": 2})
        assert order_payment_record(order_id=order.id, succeeded=True).status == "confirmed"
        assert counters("TEE-M") == (3, 0)
        assert lines_of(order) == [("TEE-M", 2, 2, "confirmed")]
        assert order_payment_record(order_id=order.id, succeeded=True).status == "confirmed"
        assert order_payment_record(order_id=order.id, succeeded=False).status == "confirmed"
        assert counters("TEE-M") == (3, 0)
        assert set(Reservation.objects.values_list("state", flat=True)) == {"committed"}
        books_balance()

    def test_captured_short_order_is_partially_confirmed(self, stock, reserve):
        order = reserve({"TEE-M": 2, "CAP": 1}, on_shortage="partial")
        order = order_payment_record(order_id=order.id, succeeded=True)
        assert order.status == "partially_confirmed"
        assert lines_of(order) == [("TEE-M", 2, 2, "confirmed"), ("CAP", 1, 0, "unavailable")]

    def test_declined_resets_the_flags(self, stock, reserve):
        order = reserve({"TEE-M": 2, "MUG": 1})
        assert order_payment_record(order_id=order.id, succeeded=False).status == "payment_failed"
        assert counters("TEE-M") == (5, 0) and counters("MUG") == (2, 0)
        assert lines_of(order) == [("TEE-M", 2, 2, "released"), ("MUG", 1, 1, "released")]
        assert order_payment_record(order_id=order.id, succeeded=True).status == "payment_failed"
        assert counters("TEE-M") == (5, 0)
        books_balance()

    def test_each_transition_writes_an_event(self, stock, reserve):
        order = reserve({"TEE-M": 1})
        order_payment_record(order_id=order.id, succeeded=True)
        order_payment_record(order_id=order.id, succeeded=True)
        assert list(
            OrderEvent.objects.filter(order=order, kind="paid")
            .order_by("id")
            .values_list("line__sku", "from_status", "to_status")
        ) == [(None, "payment_pending", "confirmed"), ("TEE-M", "reserved", "confirmed")]


@pytest.mark.django_db
class TestDecision:
    @pytest.fixture
    def asked(self, stock, reserve):
        return reserve({"TEE-M": 1, "MUG": 3}, on_shortage="ask")

    def test_confirm_in_time_goes_to_payment_and_flags_stop_expiring(self, asked):
        order = order_decide_confirm(order_id=asked.id)
        assert order.status == "payment_pending"
        assert set(Reservation.objects.values_list("expires_at", flat=True)) == {None}
        assert counters("MUG") == (2, 2)

    def test_confirm_too_late_expires_the_order(self, asked):
        make_due(asked)
        order = order_decide_confirm(order_id=asked.id)
        assert order.status == "expired"
        assert counters("TEE-M") == (5, 0) and counters("MUG") == (2, 0)
        assert set(Reservation.objects.values_list("state", flat=True)) == {"expired"}
        assert lines_of(order) == [("TEE-M", 1, 1, "released"), ("MUG", 3, 2, "released")]

    def test_confirm_twice_is_harmless(self, asked):
        order_decide_confirm(order_id=asked.id)
        assert order_decide_confirm(order_id=asked.id).status == "payment_pending"
        assert OrderEvent.objects.filter(kind="confirmed_by_shopper", line=None).count() == 1

    def test_cancel_resets_flags_once(self, asked):
        order = order_cancel(order_id=asked.id)
        assert order.status == "cancelled"
        assert lines_of(order) == [("TEE-M", 1, 1, "cancelled"), ("MUG", 3, 2, "cancelled")]
        assert counters("MUG") == (2, 0)
        assert order_cancel(order_id=asked.id).status == "cancelled"
        assert order_decide_confirm(order_id=asked.id).status == "cancelled"
        assert counters("MUG") == (2, 0)
        books_balance()

    def test_cancel_answers_for_other_states(self, stock, reserve):
        pending = reserve({"TEE-M": 1})
        with pytest.raises(PaymentPending):
            order_cancel(order_id=pending.id)
        order_payment_record(order_id=pending.id, succeeded=True)
        Order.objects.filter(id=pending.id).update(fulfillment="shipped")
        with pytest.raises(OrderShipped):
            order_cancel(order_id=pending.id)
        # Confirmed and unshipped: compensation starts (docs/compensation.md).
        Order.objects.filter(id=pending.id).update(fulfillment="unfulfilled")
        started = order_cancel(order_id=pending.id)
        assert started.status == "cancelling" and started.cancel_started
        again = order_cancel(order_id=pending.id)
        assert again.status == "cancelling" and not again.cancel_started
        assert pending.compensation_steps.count() == 5
        failed = reserve({"TEE-M": 1})
        order_payment_record(order_id=failed.id, succeeded=False)
        with pytest.raises(InvalidState):
            order_cancel(order_id=failed.id)

    def test_expire_only_when_due_and_once(self, asked):
        assert order_expire(order_id=asked.id) is False
        make_due(asked)
        assert order_expire(order_id=asked.id) is True
        assert order_expire(order_id=asked.id) is False
        assert counters("MUG") == (2, 0)
        assert Order.objects.get(id=asked.id).status == "expired"
        with pytest.raises(InvalidState):
            order_cancel(order_id=asked.id)

    def test_sweep_expires_only_due_orders(self, stock, reserve):
        due = reserve({"TEE-M": 1, "CAP": 1}, on_shortage="ask")
        fresh = reserve({"TEE-M": 1, "CAP": 1}, on_shortage="ask")
        paying = reserve({"TEE-M": 1})
        make_due(due)
        Order.objects.filter(id=paying.id).update(
            reservation_expires_at=Now() - timedelta(seconds=1)
        )
        assert orders_expire_due() == 1
        assert orders_expire_due() == 0
        statuses = dict(Order.objects.values_list("id", "status"))
        assert statuses == {
            due.id: "expired",
            fresh.id: "awaiting_decision",
            paying.id: "payment_pending",
        }
        assert counters("TEE-M") == (5, 2)
        books_balance()


def _hold_order_row(order_id) -> None:
    list(Order.objects.filter(id=order_id).select_for_update().values_list("id"))


def _db_clock():
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def _waiting_since() -> list:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT query_start FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.django_db(transaction=True)
def test_confirm_and_expiry_racing_exactly_one_wins(stock, reserve):
    """Both are eligible when they start; the order row decides; the loser changes nothing.

    While the test holds the order row, the confirm starts before the
    deadline and the expiry after it, so each one's condition is true when
    it is evaluated; only the order row's status can then tell them apart.
    """
    order = reserve({"TEE-M": 1, "MUG": 3}, on_shortage="ask")
    Order.objects.filter(id=order.id).update(reservation_expires_at=Now() + timedelta(seconds=1))
    deadline = Order.objects.get(id=order.id).reservation_expires_at
    workers = Workers()
    with transaction.atomic():
        _hold_order_row(order.id)
        workers.start(order_decide_confirm, order_id=order.id)
        wait_for_lock_waiters(1)
        assert max(_waiting_since()) < deadline, "the confirm must start before the deadline"
        wait_until(lambda: _db_clock() > deadline, what="the deadline to pass")
        workers.start(order_expire, order_id=order.id)
        wait_for_lock_waiters(2)
    results = workers.join()

    order.refresh_from_db()
    confirmed = next(r for r in results if isinstance(r, Order))
    expired = next(r for r in results if isinstance(r, bool))
    assert (confirmed.status == "payment_pending") != expired, "exactly one wins"
    kinds = list(
        OrderEvent.objects.filter(order=order, line=None)
        .exclude(kind="placed")
        .values_list("kind", flat=True)
    )
    assert kinds in (["confirmed_by_shopper"], ["reservation_expired"])
    if order.status == "payment_pending":
        assert counters("MUG") == (2, 2)
        assert set(Reservation.objects.values_list("state", "expires_at")) == {("held", None)}
    else:
        assert counters("MUG") == (2, 0)
    books_balance()


@pytest.mark.django_db(transaction=True)
def test_two_sweepers_at_once_expire_each_order_once(stock, reserve):
    order = reserve({"TEE-M": 2, "MUG": 3}, on_shortage="ask")
    make_due(order)
    workers = Workers()
    barrier = threading.Barrier(3)

    def sweep():
        barrier.wait()
        return orders_expire_due()

    with transaction.atomic():
        _hold_order_row(order.id)
        workers.start(sweep)
        workers.start(sweep)
        barrier.wait()
        wait_for_lock_waiters(2)
    assert sorted(workers.join()) == [0, 1]
    assert counters("TEE-M") == (5, 0) and counters("MUG") == (2, 0)
    assert OrderEvent.objects.filter(order=order, kind="reservation_expired").count() == 3
    books_balance()


@pytest.mark.django_db(transaction=True)
def test_multi_line_orders_over_overlapping_skus_in_random_order_never_deadlock(
    make_product, reserve
):
    skus = ["S1", "S2", "S3", "S4", "S5"]
    for sku in skus:
        make_product(sku, stock=1000)
    threads, per_thread = 6, 8
    barrier = threading.Barrier(threads + 1)

    def shopper(seed: int) -> int:
        rng = random.Random(seed)
        barrier.wait()
        for attempt in range(per_thread):
            chosen = rng.sample(skus, rng.randint(2, len(skus)))
            if attempt == 0 and "S1" not in chosen:
                # The first order of each thread queues at the gate below.
                chosen.insert(rng.randint(0, len(chosen)), "S1")
            reserve({sku: 1 for sku in chosen}, on_shortage="reject")
        return per_thread

    workers = Workers()
    first = StockItem.objects.order_by("id").first()
    with transaction.atomic():
        # Everyone queues on the lowest stock row before anyone proceeds.
        StockItem.objects.filter(id=first.id).select_for_update().get()
        for seed in range(threads):
            workers.start(shopper, seed)
        barrier.wait()
        wait_for_lock_waiters(threads)
    assert sum(workers.join()) == threads * per_thread

    assert Order.objects.count() == threads * per_thread
    for sku in skus:
        assert counters(sku) == (1000, OrderLine.objects.filter(sku=sku).count())
    books_balance()


@pytest.mark.django_db
class TestPaymentLink:
    def test_payment_start_creates_the_orders_payment(self, stock, reserve):
        order = reserve({"TEE-M": 2})
        order = order_payment_start(order=order)
        payment = order.payment
        assert payment.reference == f"order-{order.number}"
        assert (payment.amount, payment.currency, payment.payment_method) == (
            Decimal("39.98"),
            "EUR",
            "pm_card_ok",
        )
        assert payment.owner_id == order.owner_id and payment.status == "none"
        assert order_payment_start(order=Order.objects.get(id=order.id)).payment_id == payment.id

    def test_free_order_is_confirmed_without_a_payment(self, make_product, reserve):
        make_product("GIFT", price="0.00", stock=3)
        order = order_payment_start(order=reserve({"GIFT": 1}))
        assert order.status == "confirmed" and order.payment is None
        assert counters("GIFT") == (2, 0)

    def test_apply_follows_the_payment_row(self, stock, reserve):
        order = order_payment_start(order=reserve({"TEE-M": 1}))
        assert order_payment_apply(order_id=order.id).status == "payment_pending"
        Payment.objects.filter(id=order.payment_id).update(status="captured")
        assert order_payment_apply(order_id=order.id).status == "confirmed"
        failed = order_payment_start(order=reserve({"TEE-M": 1}))
        Payment.objects.filter(id=failed.payment_id).update(status="failed")
        assert order_payment_apply(order_id=failed.id).status == "payment_failed"
        assert counters("TEE-M") == (4, 0)
        books_balance()

    @pytest.mark.parametrize(
        "outcome, status", [("succeeded", "confirmed"), ("declined", "payment_failed")]
    )
    def test_settled_handler_applies_the_outcome_once(self, stock, reserve, outcome, status):
        order = order_payment_start(order=reserve({"MUG": 2}))
        order_payment_settled(payment=order.payment, outcome=outcome)
        order_payment_settled(payment=order.payment, outcome=outcome)
        assert Order.objects.get(id=order.id).status == status
        assert OrderEvent.objects.filter(order=order, line=None).count() == 2
        books_balance()

    def test_settled_handler_ignores_a_payment_of_no_order(self, stock):
        payment = payment_create(
            reference="refund-1",
            amount=Decimal("1.00"),
            currency="EUR",
            payment_method="pm_card_ok",
        )
        order_payment_settled(payment=payment, outcome="succeeded")
        assert not Order.objects.exists()

    def test_handler_is_the_configured_one(self, settings):
        assert settings.PAYMENTS_SETTLED_HANDLER == "orders.services.order_payment_settled"
