"""Same-key races on the real checkout (`POST /api/v1/orders/`), not the test-only probe.

Each test releases its contenders together (barrier or a held winner),
asserts that the overlap really happened, and ends with one order, at most
one charge in the simulator's ledger and one stored answer. The provider is
the simulator process; the shop runs in this process (APIClient in threads,
each with its own connection) unless a crash in a real gunicorn is needed.
"""

from __future__ import annotations

import threading
import time
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now
from rest_framework.test import APIClient

from core.api_tokens import api_token_issue
from idempotency import failpoints
from idempotency.keys import keys_complete_abandoned
from idempotency.models import FINISHED, IdempotencyKey
from inventory import selectors as inventory_selectors
from inventory.models import Reservation, StockItem
from orders.models import Order
from payments.models import PaymentSettlement
from payments.settlement import payment_settle
from tests.concurrency import Workers, lock_waiters, wait_until
from tests.orders.conftest import ADDRESS
from tests.support.simulator import assert_reconciled

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/v1/orders/"
LOCK_TTL = 3


def order_request(lines: dict[str, int], *, method: str = "pm_card_ok") -> dict:
    return {
        "lines": [{"sku": sku, "quantity": q} for sku, q in lines.items()],
        "on_shortage": "reject",
        "payment_method": method,
        "shipping_address": ADDRESS,
    }


def client_for(user) -> APIClient:
    token = api_token_issue(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


def post(client: APIClient, body: dict, key: str):
    try:
        return client.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY=key)
    finally:
        connection.close()


def charges(provider) -> list[dict]:
    return [
        op for op in provider.ledger() if op["kind"] == "capture" and op["status"] == "succeeded"
    ]


def counters(sku: str) -> tuple[int, int]:
    stock = StockItem.objects.get(product__sku=sku)
    return stock.on_hand, stock.reserved


def assert_one_order_one_charge_one_answer(provider, *, key: str, sku: str, left: int) -> Order:
    order = Order.objects.get()
    assert order.status == "confirmed"
    assert len(charges(provider)) == 1
    assert sum(Decimal(op["amount"]) for op in charges(provider)) == order.total
    row = IdempotencyKey.objects.get(key=key)
    assert row.recovery_point == FINISHED and row.response_status == 201
    assert counters(sku) == (left, 0)
    assert inventory_selectors.stock_drift() == []
    assert not Reservation.objects.filter(state="held").exists()
    assert_reconciled()
    return order


def test_concurrent_identical_checkouts_make_one_order(shopper, make_product, provider):
    """Six identical POSTs released together: one runs, five get 409 while it holds the key."""
    n = 6
    make_product("TEE-M", price="19.99", stock=10)
    body = order_request({"TEE-M": 2})
    clients = [client_for(shopper) for _ in range(n)]
    barrier = threading.Barrier(n, timeout=60)
    answered = threading.Semaphore(0)
    others_answered = threading.Event()
    held: list[str] = []
    first: list = [None] * n

    def hold_the_winner(name: str) -> None:
        # The request that got the key holds it (phase 1 committed: order and
        # flags, the key locked) until every other request has been answered.
        held.append(name)
        others_answered.wait(timeout=120)

    def request(i: int) -> None:
        barrier.wait()
        first[i] = post(clients[i], body, "same-key")
        answered.release()

    def counter() -> None:
        for _ in range(n - 1):
            if not answered.acquire(timeout=120):
                return
        others_answered.set()

    workers = Workers()
    with failpoints.hook("order.create.reserved.after_commit", hold_the_winner):
        workers.start(counter)
        for i in range(n):
            workers.start(request, i)
        workers.join(timeout=240)

    statuses = sorted(r.status_code for r in first)
    # The overlap really happened: five answers came while the winner held the key.
    assert statuses == [201] + [409] * (n - 1), statuses
    assert held == ["order.create.reserved.after_commit"]
    for r in first:
        if r.status_code == 409:
            assert r.json()["code"] == "idempotency_key_in_use" and r["Retry-After"]
    winner = next(r for r in first if r.status_code == 201)
    assert winner.json()["status"] == "confirmed"

    for client in clients:
        again = post(client, body, "same-key")
        assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
        assert again.content == winner.content
    order = assert_one_order_one_charge_one_answer(provider, key="same-key", sku="TEE-M", left=8)
    assert winner.json()["id"] == str(order.id)


def test_retry_does_not_wait_on_a_first_request_queued_behind_a_busy_stock_row(
    shopper, make_product, provider, settings
):
    """The first request's phase 1 inserted the key and waits for a stock row this test
    holds; the retry's INSERT of the same key waits on that uncommitted row. It must get
    409 `idempotency_key_in_use` with Retry-After after IDEMPOTENCY_CLAIM_WAIT, not hold a
    worker until the stock row is free."""
    settings.IDEMPOTENCY_CLAIM_WAIT = 1.0
    make_product("TEE-M", price="19.99", stock=5)
    body = order_request({"TEE-M": 1})
    first_client, retry_client = client_for(shopper), client_for(shopper)
    results: dict = {}
    workers = Workers()
    stock_id = StockItem.objects.get(product__sku="TEE-M").id
    with transaction.atomic():
        StockItem.objects.select_for_update().get(id=stock_id)
        workers.start(lambda: results.__setitem__("first", post(first_client, body, "busy")))
        # The first request is inside phase 1 (its key row inserted, uncommitted),
        # queued behind the stock row.
        wait_until(lambda: lock_waiters() >= 1, timeout=60, what="the first request to queue")
        retry = threading.Thread(
            target=lambda: results.__setitem__("retry", post(retry_client, body, "busy")),
            daemon=True,
        )
        started = time.monotonic()
        retry.start()
        retry.join(timeout=30)
        waited = time.monotonic() - started
        # Still holding the stock row: the retry answered without waiting for it.
        assert not retry.is_alive(), "the retry waits for the first request's phase 1"
        assert lock_waiters() == 1  # the first request still queued behind the row
    response = results["retry"]
    assert response.status_code == 409, response.content
    assert response.json()["code"] == "idempotency_key_in_use"
    assert int(response["Retry-After"]) >= 1
    assert waited >= 0.9  # it did wait on the first request's insert, for the claim wait
    workers.join(timeout=120)
    assert results["first"].status_code == 201, results["first"].content
    again = post(retry_client, body, "busy")
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.content == results["first"].content
    assert_one_order_one_charge_one_answer(provider, key="busy", sku="TEE-M", left=4)


# -- a retry racing the completer on an order abandoned by a real crash -----------------------


@pytest.fixture
def shop(gunicorn, provider):
    def start(**env):
        return gunicorn(
            workers=1,
            PAYMENTS_PROVIDER_URL=provider.url,
            PAYMENTS_PROVIDER_TIMEOUT="2",
            IDEMPOTENCY_LEASE_TTL=str(LOCK_TTL),
            DB_POOL_MAX="2",
            **env,
        )

    return start


def _lock_expired(key: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT leased_at IS NULL OR leased_at < now() - make_interval(secs => %s)"
            " FROM idempotency_idempotencykey WHERE key = %s",
            [LOCK_TTL, key],
        )
        row = cursor.fetchone()
    return bool(row and row[0])


@pytest.mark.slow
@pytest.mark.parametrize(
    "point", ["order.create.reserved.after_commit", "payments.capture.after_provider"]
)
def test_retry_racing_the_completer_on_a_crashed_checkout(
    shop, shopper, make_product, provider, settings, point
):
    """A real gunicorn worker dies mid-checkout; then a retry and the completer start
    together. Whoever takes the key over holds it (before its capture) until the other
    has given up: the other really tried while the key was held."""
    import requests

    settings.IDEMPOTENCY_LEASE_TTL = LOCK_TTL
    settings.IDEMPOTENCY_ABANDON_AFTER = 0
    make_product("TEE-M", price="19.99", stock=5)
    body = order_request({"TEE-M": 2})
    server = shop(failpoints=f"{point}=exit@1")
    token = api_token_issue(user=shopper).key
    with pytest.raises(requests.ConnectionError):
        requests.post(
            f"{server.url}{URL}",
            json=body,
            headers={"Authorization": f"Token {token}", "Idempotency-Key": "crash"},
            timeout=60,
        )
    assert "failpoint " + point in server.log()
    assert IdempotencyKey.objects.get(key="crash").recovery_point == "reserved"
    wait_until(lambda: _lock_expired("crash"), timeout=60, what="the dead run's lock to expire")

    client = client_for(shopper)
    barrier = threading.Barrier(2, timeout=60)
    release = threading.Event()
    holder: list[str] = []
    outcome: dict = {}

    def hold_the_taker(name: str) -> None:
        holder.append(threading.current_thread().name)
        release.wait(timeout=120)

    def retry() -> None:
        barrier.wait()
        outcome["retry"] = post(client, body, "crash")

    def completer() -> None:
        barrier.wait()
        try:
            outcome["completer"] = keys_complete_abandoned()
        finally:
            connection.close()

    threads = [
        threading.Thread(target=retry, name="retry", daemon=True),
        threading.Thread(target=completer, name="completer", daemon=True),
    ]
    with failpoints.hook("checkout.capture.before", hold_the_taker):
        for t in threads:
            t.start()
        try:
            # One took the key over and is held; the other finished meanwhile.
            wait_until(lambda: holder and len(outcome) == 1, timeout=90, what="one taker")
        finally:
            release.set()
            for t in threads:
                t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert len(holder) == 1, holder
    if holder == ["retry"]:
        assert outcome["completer"] == 0  # it found the key held by the retry
        assert outcome["retry"].status_code == 201
        assert "Idempotent-Replayed" not in outcome["retry"]
    else:
        assert outcome["completer"] == 1
        lost = outcome["retry"]
        assert lost.status_code == 409 and lost.json()["code"] == "idempotency_key_in_use"
    final = post(client, body, "crash")
    assert final.status_code == 201 and final["Idempotent-Replayed"] == "true"
    order = assert_one_order_one_charge_one_answer(provider, key="crash", sku="TEE-M", left=3)
    assert final.json()["id"] == str(order.id)
    assert IdempotencyKey.objects.get(key="crash").runs == 2


# -- settlement racing a retry's look-up on a payment_pending order ---------------------------


@pytest.mark.parametrize("second", ["settlement", "retry"])
def test_settlement_racing_a_retrys_lookup(shopper, make_product, provider, second):
    """The answer was lost (202, payment pending). Settlement and a retry both ask the
    provider; one of them is held after/before its look-up until the other has recorded
    the outcome and confirmed the order. Either way: one order, one charge, one answer."""
    make_product("TEE-M", price="19.99", stock=5)
    body = order_request({"TEE-M": 1}, method="pm_card_timeout")
    client = client_for(shopper)
    pending = post(client, body, "lost")
    assert pending.status_code == 202, pending.content
    assert pending.json()["status"] == "payment_pending"
    assert IdempotencyKey.objects.get(key="lost").recovery_point == "payment_unknown"
    settlement = PaymentSettlement.objects.get(done_at__isnull=True)
    PaymentSettlement.objects.filter(id=settlement.id).update(next_attempt_at=Now())

    reached = threading.Event()
    release = threading.Event()
    results: dict = {}

    def hold(name: str) -> None:
        reached.set()
        release.wait(timeout=120)

    def settle() -> None:
        try:
            results["settlement"] = payment_settle(settlement_id=settlement.id)
        finally:
            connection.close()

    def retry() -> None:
        results["retry"] = post(client, body, "lost")

    # `second` is held: settlement right after its look-up heard "captured", or the
    # retry right before its look-up; the other runs to its end meanwhile.
    held_point, held_fn, free_fn = {
        "settlement": ("payments.settle.after_lookup", settle, retry),
        "retry": ("checkout.capture.before", retry, settle),
    }[second]
    with failpoints.hook(held_point, hold):
        held_thread = threading.Thread(target=held_fn, daemon=True)
        held_thread.start()
        try:
            assert reached.wait(timeout=60)
            free = threading.Thread(target=free_fn, daemon=True)
            free.start()
            free.join(timeout=120)
            assert not free.is_alive()
            assert held_thread.is_alive()  # the overlap: the other finished while it was held
            assert Order.objects.get().status == "confirmed"
        finally:
            release.set()
            held_thread.join(timeout=120)
    assert not held_thread.is_alive()
    answer = results["retry"]
    assert answer.status_code == 201, answer.content
    assert answer.json()["status"] == "confirmed"
    results["settlement"].refresh_from_db()
    assert results["settlement"].settled_at is not None
    again = post(client, body, "lost")
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.content == answer.content
    assert_one_order_one_charge_one_answer(provider, key="lost", sku="TEE-M", left=4)
