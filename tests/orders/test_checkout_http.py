"""Checkout through a real gunicorn: the hot sku under load, deadlock freedom, crashes.

The server is a separate process (fixed number of sync workers, a small
connection pool each, so PostgreSQL's connection limit is respected) on the
test database; the provider is the simulator process.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
import requests
from django.db import transaction

from core.api_tokens import api_token_issue
from idempotency.keys import keys_complete_abandoned
from idempotency.models import IdempotencyKey
from inventory import selectors as inventory_selectors
from inventory.models import Reservation, StockItem
from orders.models import Order
from payments.models import Payment
from tests.concurrency import wait_for_lock_waiters, wait_until
from tests.orders.conftest import ADDRESS
from tests.support.simulator import assert_reconciled

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WORKERS = 4


@pytest.fixture
def shop(gunicorn, provider):
    """Start the shop: `shop(workers=4, failpoints="name=exit@1")` -> Server."""

    def start(*, workers: int = WORKERS, failpoints: str | None = None, **env):
        return gunicorn(
            workers=workers,
            failpoints=failpoints,
            PAYMENTS_PROVIDER_URL=provider.url,
            PAYMENTS_PROVIDER_TIMEOUT="2",
            IDEMPOTENCY_LEASE_TTL="3",
            DB_POOL_MAX="2",
            **env,
        )

    return start


def token_for(user) -> str:
    return api_token_issue(user=user).key


def order_body(lines: dict[str, int], **extra) -> dict:
    return {
        "lines": [{"sku": sku, "quantity": q} for sku, q in lines.items()],
        "on_shortage": "reject",
        "payment_method": "pm_card_ok",
        "shipping_address": ADDRESS,
        **extra,
    }


def post_order(url: str, token: str, body: dict, key: str, *, timeout: float = 60):
    return requests.post(
        f"{url}/api/v1/orders/",
        json=body,
        headers={"Authorization": f"Token {token}", "Idempotency-Key": key},
        timeout=timeout,
    )


def counters(sku: str) -> tuple[int, int]:
    stock = StockItem.objects.get(product__sku=sku)
    return stock.on_hand, stock.reserved


def charges(provider) -> list[dict]:
    return [
        op for op in provider.ledger() if op["kind"] == "capture" and op["status"] == "succeeded"
    ]


def nothing_dangling() -> None:
    assert inventory_selectors.stock_drift() == []
    held = Reservation.objects.filter(state="held").exclude(
        order_line__order__status__in=["awaiting_decision", "payment_pending"]
    )
    assert not held.exists()
    assert not Order.objects.filter(status="payment_pending").exists()


def test_hot_sku_200_attempts_for_50_units_40_in_flight(shop, make_product, make_user, provider):
    """Exactly 50 sold, reserved back to 0, no 5xx, no deadlock, one charge per order.

    The test holds the stock row while the first requests arrive, until every
    gunicorn worker is seen waiting for it: all workers contend at once.
    """
    make_product("HOT", price="10.00", stock=50)
    tokens = [token_for(make_user()) for _ in range(8)]
    server = shop()
    attempts, in_flight = 200, 40
    barrier = threading.Barrier(in_flight + 1)
    statuses: list[tuple[int, str]] = []
    guard = threading.Lock()

    def client(index: int) -> None:
        session = requests.Session()
        barrier.wait()
        for attempt in range(index, attempts, in_flight):
            token = tokens[attempt % len(tokens)]
            response = session.post(
                f"{server.url}/api/v1/orders/",
                json=order_body({"HOT": 1}),
                headers={"Authorization": f"Token {token}", "Idempotency-Key": f"hot-{attempt}"},
                timeout=120,
            )
            code = response.json().get("code") or response.json().get("status")
            with guard:
                statuses.append((response.status_code, code))

    with ThreadPoolExecutor(in_flight) as pool:
        stock_id = StockItem.objects.get(product__sku="HOT").id
        with transaction.atomic():
            StockItem.objects.filter(id=stock_id).select_for_update().get()
            futures = [pool.submit(client, i) for i in range(in_flight)]
            barrier.wait()
            assert wait_for_lock_waiters(WORKERS, timeout=60) >= WORKERS
        for future in futures:
            future.result()

    tally = Counter(statuses)
    assert len(statuses) == attempts
    assert tally == {(201, "confirmed"): 50, (409, "insufficient_stock"): 150}, tally
    assert counters("HOT") == (0, 0)
    assert Order.objects.filter(status="confirmed").count() == 50
    assert not Order.objects.exclude(status="confirmed").exists()
    assert sum(Decimal(op["amount"]) for op in charges(provider)) == Decimal("500.00")
    assert len(charges(provider)) == 50
    assert "Deadlock" not in server.log() and "Traceback" not in server.log()
    nothing_dangling()
    assert_reconciled()


def test_multi_line_orders_in_random_line_order_never_deadlock(shop, make_product, make_user):
    skus = ["S1", "S2", "S3", "S4", "S5"]
    for sku in skus:
        make_product(sku, price="1.00", stock=1000)
    token = token_for(make_user())
    server = shop()
    rng = random.Random(7)
    bodies = [
        order_body({sku: rng.randint(1, 3) for sku in rng.sample(skus, rng.randint(2, 5))})
        for _ in range(80)
    ]
    barrier = threading.Barrier(17)

    def send(chunk: list[dict]) -> list[int]:
        barrier.wait()
        return [post_order(server.url, token, body, uuid.uuid4().hex).status_code for body in chunk]

    with ThreadPoolExecutor(16) as pool:
        with transaction.atomic():
            # Every order's first (lowest) stock row is locked: all workers queue.
            list(StockItem.objects.select_for_update().order_by("id"))
            futures = [pool.submit(send, bodies[i::16]) for i in range(16)]
            barrier.wait()
            wait_for_lock_waiters(WORKERS, timeout=60)
        results = [code for future in futures for code in future.result()]

    assert Counter(results) == {201: len(bodies)}
    for sku in skus:
        wanted = sum(
            line["quantity"] for body in bodies for line in body["lines"] if line["sku"] == sku
        )
        assert counters(sku) == (1000 - wanted, 0)
    assert "Deadlock" not in server.log()
    nothing_dangling()


# -- crashes at each phase boundary ---------------------------------------------------------------

# A crash before phase 1 commits leaves nothing (no key row, no order); from every
# later point the key exists and the run ends finished, confirmed, one charge.
BEFORE_PHASE_1_COMMITS = "checkout.reserve.after_hold"
CRASH_POINTS = [
    # inside phase 1: flags held, order not committed -> rolled back by PostgreSQL
    BEFORE_PHASE_1_COMMITS,
    # phase 1 committed (order, flags, payment row); the provider not called
    "order.create.reserved.after_commit",
    # the same state, reached from the other side of the commit
    "checkout.capture.before",
    # the provider charged; the shop recorded nothing
    "payments.capture.after_provider",
    # the payment recorded as captured; the order still payment_pending
    "checkout.capture.after",
    # phase 3 about to commit: rolled back
    "order.create.finished.before_commit",
    # phase 3 committed; the answer never sent
    "order.create.finished.after_commit",
]


def crash_once(shop, make_product, make_user, point: str):
    make_product("TEE-M", price="19.99", stock=5)
    user = make_user()
    token = token_for(user)
    server = shop(workers=1, failpoints=f"{point}=exit@1")
    body = order_body({"TEE-M": 2})
    with pytest.raises(requests.ConnectionError):
        post_order(server.url, token, body, "crash-key")
    assert f"failpoint {point}" in server.log()
    if point == BEFORE_PHASE_1_COMMITS:
        assert not IdempotencyKey.objects.exists() and not Order.objects.exists()
    else:
        # Phase 1 committed; only the last point's phase 3 committed too.
        last = point == "order.create.finished.after_commit"
        row = IdempotencyKey.objects.get(key="crash-key")
        assert row.recovery_point == ("finished" if last else "reserved"), row.recovery_point
        assert Order.objects.count() == 1
    return server, token, body


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_crash_then_retry_gives_one_order_and_at_most_one_charge(
    shop, make_product, make_user, provider, point
):
    server, token, body = crash_once(shop, make_product, make_user, point)

    def retried():
        response = post_order(server.url, token, body, "crash-key")
        return response if response.status_code != 409 else None

    response = wait_until(retried, timeout=30, what="the key's lock to expire")
    assert response.status_code == 201, response.content
    assert response.json()["status"] == "confirmed"
    if point == BEFORE_PHASE_1_COMMITS:
        assert "Idempotent-Replayed" not in response.headers  # ran as a new request
    if point == "order.create.finished.after_commit":
        assert response.headers["Idempotent-Replayed"] == "true"  # stored before the crash
    replay = post_order(server.url, token, body, "crash-key")
    assert replay.content == response.content and replay.headers["Idempotent-Replayed"] == "true"

    row = IdempotencyKey.objects.get(key="crash-key")
    assert row.recovery_point == "finished" and row.response_status == 201
    assert Order.objects.count() == 1
    assert len(charges(provider)) == 1
    assert counters("TEE-M") == (3, 0)
    nothing_dangling()
    assert_reconciled()


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_crash_without_retry_leaves_nothing_dangling(
    shop, make_product, make_user, provider, point, settings
):
    crash_once(shop, make_product, make_user, point)
    settings.IDEMPOTENCY_LEASE_TTL = 3
    settings.IDEMPOTENCY_ABANDON_AFTER = 0

    def settled():
        keys_complete_abandoned()
        row = IdempotencyKey.objects.filter(key="crash-key").first()
        return row is None or row.recovery_point == "finished"

    wait_until(settled, timeout=30, what="the completer to settle the key")
    row = IdempotencyKey.objects.filter(key="crash-key").first()
    if point == BEFORE_PHASE_1_COMMITS:
        # Nothing had committed: no key row, as if the request never came.
        assert row is None
        assert not Order.objects.exists() and not Payment.objects.exists()
        assert counters("TEE-M") == (5, 0)
        assert charges(provider) == []
    else:
        # Phase 1 committed: the completer (or, for the last point, the crashed run
        # itself) drove it to the end: finished, confirmed, exactly one charge.
        assert row is not None and row.recovery_point == "finished"
        assert row.response_status == 201
        order = Order.objects.get()
        assert order.status == "confirmed"
        assert row.response_body and str(order.id) in row.response_body
        assert counters("TEE-M") == (3, 0)
        assert len(charges(provider)) == 1
    nothing_dangling()
    assert_reconciled()


@pytest.mark.parametrize(
    "point", ["order.confirm.reserved.after_commit", "payments.capture.after_provider"]
)
def test_confirm_crash_then_retry_charges_once(shop, make_product, make_user, provider, point):
    make_product("TEE-M", price="19.99", stock=1)
    token = token_for(make_user())
    server = shop(workers=1, failpoints=f"{point}=exit@1")
    placed = post_order(server.url, token, order_body({"TEE-M": 2}, on_shortage="ask"), "ask")
    assert placed.status_code == 201 and placed.json()["status"] == "awaiting_decision"
    url = f"{server.url}/api/v1/orders/{placed.json()['id']}/confirm/"
    headers = {"Authorization": f"Token {token}", "Idempotency-Key": "confirm"}
    with pytest.raises(requests.ConnectionError):
        requests.post(url, json={}, headers=headers, timeout=60)

    def retried():
        response = requests.post(url, json={}, headers=headers, timeout=60)
        return response if response.status_code != 409 else None

    response = wait_until(retried, timeout=30, what="the key's lock to expire")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "partially_confirmed"
    assert len(charges(provider)) == 1
    assert counters("TEE-M") == (0, 0)
    nothing_dangling()
    assert_reconciled()


def test_pending_payment_is_settled_by_a_worker_without_a_retry(
    shop, make_product, make_user, provider, celery_worker_process
):
    """The answer is lost (202); the settlement sweeper in a real worker confirms the order."""
    make_product("TEE-M", price="19.99", stock=5)
    token = token_for(make_user())
    server = shop(workers=1)
    body = order_body({"TEE-M": 1}, payment_method="pm_card_timeout")
    response = post_order(server.url, token, body, "k")
    assert response.status_code == 202
    celery_worker_process(PAYMENTS_PROVIDER_URL=provider.url)
    from payments.tasks import sweep_settlements

    rang = [0.0]

    def confirmed():
        # Beat's job, done by hand: ring the sweeper about once a second.
        if time.monotonic() - rang[0] > 1:
            sweep_settlements.delay()
            rang[0] = time.monotonic()
        return Order.objects.filter(status="confirmed").exists()

    wait_until(confirmed, timeout=60, what="settlement to confirm the order")
    assert counters("TEE-M") == (4, 0)
    assert len(charges(provider)) == 1
    nothing_dangling()
    assert_reconciled()
