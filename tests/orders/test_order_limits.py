"""Limits per shopper on new orders (docs/checkout.md, "Limits per shopper").

A shopper places at most `ORDER_PLACE_PER_MINUTE` orders a minute and holds
at most `ORDER_HOLDING_MAX` orders awaiting a decision or a payment outcome;
past either, a new order is 429 `throttled` with `Retry-After` and nothing is
held or stored (the same key may be sent again later). A replay of an
answered key, and a retry of an open one, are never throttled. Two
placements of one shopper at the cap minus one cannot both pass: the owner's
row lock makes the count and the insert one step (the unlocked twin shows
both through).
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.db import connection, transaction
from django.db.models.functions import Now

from core.errors import ApplicationError
from idempotency.models import IdempotencyKey
from inventory.models import Reservation, StockItem
from orders import lock_objects
from orders.models import Order
from orders.services import order_hold
from tests.concurrency import wait_for_lock_waiters
from tests.conftest import assert_problem
from tests.orders.conftest import ADDRESS, line_requests

pytestmark = pytest.mark.django_db

URL = "/api/v1/orders/"
# An `ask` order: 8 shirts held, the cap short (none in stock), so it awaits the decision.
ASK = {"TEE-M": 8, "CAP": 1}


def order_request(lines=None, *, on_shortage="ask", method="pm_card_ok") -> dict:
    return {
        "lines": [{"sku": sku, "quantity": q} for sku, q in (lines or ASK).items()],
        "on_shortage": on_shortage,
        "payment_method": method,
        "shipping_address": ADDRESS,
    }


def place(client, *, key=None, **kwargs):
    return client.post(
        URL, order_request(**kwargs), format="json", HTTP_IDEMPOTENCY_KEY=key or uuid.uuid4().hex
    )


def reserved(sku: str = "TEE-M") -> int:
    return StockItem.objects.get(product__sku=sku).reserved


def assert_throttled(response, *, most: int, limit: str | None = None) -> int:
    body = assert_problem(response, 429, "throttled")
    if limit is not None:
        assert body["limit"] == limit, body
    wait = int(response["Retry-After"])
    assert 1 <= wait <= most, wait
    return wait


@pytest.fixture
def catalog(make_product):
    make_product("TEE-M", price="19.99", stock=100)
    make_product("CAP", price="12.00", stock=0)


@pytest.fixture
def limits(settings):
    """Set the two limits for this test (the test settings make both generous)."""

    def set_limits(*, rate: int = 1000, holding: int = 1000) -> None:
        settings.ORDER_PLACE_PER_MINUTE = rate
        settings.ORDER_HOLDING_MAX = holding

    return set_limits


def test_past_the_holding_cap_a_new_order_is_429_and_holds_nothing(shopper_client, catalog, limits):
    limits(holding=3)
    for index in range(3):
        response = place(shopper_client, key=f"ask-{index}")
        assert response.status_code == 201, response.content
        assert response.json()["status"] == "awaiting_decision"
    assert reserved() == 24

    refused = place(shopper_client, key="ask-3")
    # The earliest awaiting order's expiry: then a place frees itself.
    assert_throttled(refused, most=django_settings.ORDER_RESERVATION_TTL_SECONDS, limit="holding")
    assert reserved() == 24
    assert Order.objects.count() == 3 and Reservation.objects.count() == 3
    assert not IdempotencyKey.objects.filter(key="ask-3").exists()

    # A decided order frees its place; the refused key was never stored, so it runs now.
    first = Order.objects.order_by("number").first()
    cancelled = shopper_client.post(f"{URL}{first.id}/cancel/", HTTP_IDEMPOTENCY_KEY="cancel-0")
    assert cancelled.status_code == 200, cancelled.content
    again = place(shopper_client, key="ask-3")
    assert again.status_code == 201, again.content
    assert "Idempotent-Replayed" not in again
    assert reserved() == 24


def test_past_the_rate_a_new_order_is_429_until_its_minute_has_passed(
    shopper_client, catalog, limits
):
    limits(rate=3)
    for index in range(3):
        assert place(shopper_client, key=f"o-{index}").status_code == 201
    refused = place(shopper_client, key="o-3")
    assert_throttled(refused, most=60, limit="rate")
    assert reserved() == 24 and Order.objects.count() == 3
    assert not IdempotencyKey.objects.filter(key="o-3").exists()

    # A minute later by the database clock, the same key places the order.
    Order.objects.update(created_at=Now() - timedelta(seconds=61))
    again = place(shopper_client, key="o-3")
    assert again.status_code == 201, again.content
    assert reserved() == 32


def test_limits_count_per_shopper_and_staff_are_no_exception(
    shopper_client, staff_client, catalog, limits
):
    limits(holding=1)
    assert place(shopper_client).status_code == 201
    assert_throttled(place(shopper_client), most=django_settings.ORDER_RESERVATION_TTL_SECONDS)
    # Another user's orders do not count; staff placing orders hold stock like anyone.
    assert place(staff_client).status_code == 201
    assert_throttled(place(staff_client), most=django_settings.ORDER_RESERVATION_TTL_SECONDS)


def test_a_replay_of_an_answered_key_is_never_throttled(shopper_client, catalog, limits):
    limits(rate=2, holding=1)
    refused = place(shopper_client, key="short", lines={"CAP": 1}, on_shortage="reject")
    assert_problem(refused, 409, "insufficient_stock")
    first = place(shopper_client, key="k1")
    assert first.status_code == 201, first.content
    assert_throttled(place(shopper_client, key="k2"), most=60 * 60)

    # A retry storm of answered keys keeps getting the stored answers, never a 429.
    for _ in range(5):
        again = place(shopper_client, key="k1")
        assert (again.status_code, again.content) == (first.status_code, first.content)
        assert again["Idempotent-Replayed"] == "true"
        stored = place(shopper_client, key="short", lines={"CAP": 1}, on_shortage="reject")
        assert (stored.status_code, stored.content) == (refused.status_code, refused.content)
        assert stored["Idempotent-Replayed"] == "true"
    assert Order.objects.count() == 1 and reserved() == 8


@pytest.mark.django_db(transaction=True)
def test_a_retry_of_an_open_key_is_never_throttled(shopper_client, catalog, limits, provider):
    """A payment_pending answer leaves the key open: its retry goes on, at the cap or not."""
    limits(rate=1, holding=1)
    body = {"lines": {"TEE-M": 2}, "on_shortage": "reject", "method": "pm_card_timeout"}
    pending = place(shopper_client, key="slow", **body)
    assert pending.status_code == 202, pending.content
    assert_throttled(place(shopper_client, key="next"), most=60)

    retry = place(shopper_client, key="slow", **body)
    assert retry.status_code == 201, retry.content
    assert retry.json()["status"] == "confirmed"
    assert Order.objects.count() == 1


# -- two placements of one shopper at the cap minus one ----------------------------------


def _hold(owner, lines=ASK):
    return order_hold(
        owner=owner,
        lines=line_requests(lines),
        on_shortage="ask",
        payment_method="pm_card_ok",
        shipping_address=ADDRESS,
    )


@pytest.fixture(params=["owner_locked", "unlocked_twin"])
def owner_lock(request, monkeypatch):
    """The real owner's row lock, or the twin that counts without it (the old shape)."""
    if request.param == "unlocked_twin":
        monkeypatch.setattr(lock_objects, "order_owner_lock", lambda *, owner_id: None)
    return request.param


@pytest.mark.django_db(transaction=True)
def test_two_placements_at_the_cap_minus_one_cannot_both_pass(
    shopper, catalog, make_product, limits, owner_lock
):
    # The second placement holds other stock rows: the only lock the two share is the owner's.
    make_product("MUG", price="7.50", stock=100)
    make_product("HAT", price="9.00", stock=0)
    limits(holding=2)
    _hold(shopper)  # one held: one place left
    inside, release = threading.Event(), threading.Event()
    results: dict[str, object] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                results["first"] = _hold(shopper)
                inside.set()  # the order is inserted, its transaction still open
                release.wait(60)
        except ApplicationError as exc:
            results["first"] = exc
        finally:
            inside.set()
            connection.close()

    def second() -> None:
        try:
            inside.wait(60)
            results["second"] = _hold(shopper, {"MUG": 8, "HAT": 1})
        except ApplicationError as exc:
            results["second"] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    try:
        assert inside.wait(30)
        if owner_lock == "owner_locked":
            # The second placement waits for the first one's owner row lock: they overlap.
            wait_for_lock_waiters(1)
        else:
            threads[1].join(30)  # the twin does not wait: it counts one held order
            assert not threads[1].is_alive()
    finally:
        release.set()
        for thread in threads:
            thread.join(30)
    assert isinstance(results["first"], Order), results
    holding = Order.objects.filter(status="awaiting_decision").count()
    if owner_lock == "owner_locked":
        refusal = results["second"]
        assert isinstance(refusal, ApplicationError) and refusal.code == "throttled", results
        assert refusal.status == 429 and int(refusal.headers["Retry-After"]) >= 1
        assert holding == 2 and (reserved("TEE-M"), reserved("MUG")) == (16, 0)
    else:
        # Without the lock each counted one held order: both passed, one over the cap.
        assert isinstance(results["second"], Order), results
        assert holding == 3 and (reserved("TEE-M"), reserved("MUG")) == (16, 8)


def test_the_schema_declares_429_for_a_new_order(api_client):
    paths = api_client.get("/api/schema/", HTTP_ACCEPT="application/json").json()["paths"]
    answer = paths["/api/v1/orders/"]["post"]["responses"]["429"]
    assert "throttled" in answer["description"] and "Retry-After" in answer["description"]
    assert "application/problem+json" in answer["content"]
    # Only placing is limited: a decision on an order is not a new order.
    assert "429" not in paths["/api/v1/orders/{order_id}/confirm/"]["post"]["responses"]
