"""Every branch of the checkout contract through the API, each answer replayed on retry.

Real PostgreSQL, a real simulator process as the provider; the shop runs in
this process (APIClient). Crashes and concurrency through a real server are
in test_checkout_http.py.
"""

import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now

from idempotency.keys import keys_complete_abandoned
from idempotency.models import IdempotencyKey, OutboxMessage
from inventory import selectors as inventory_selectors
from inventory.models import Reservation, StockItem
from orders.models import Order
from orders.services import order_expire
from orders.tasks import expire_reservations
from payments.models import Payment
from tests.concurrency import Workers, wait_for_lock_waiters, wait_until
from tests.conftest import assert_problem
from tests.orders.conftest import ADDRESS
from tests.support.simulator import assert_reconciled, settle_due

pytestmark = pytest.mark.django_db(transaction=True)


def order_request(lines, *, on_shortage="reject", method="pm_card_ok", **extra):
    return {
        "lines": [{"sku": sku, "quantity": q} for sku, q in lines.items()],
        "on_shortage": on_shortage,
        "payment_method": method,
        "shipping_address": ADDRESS,
        **extra,
    }


def post(client, path, body=None, *, key=None):
    return client.post(
        path, body if body is not None else {}, format="json", HTTP_IDEMPOTENCY_KEY=key
    )


def place(client, lines, *, key=None, **kwargs):
    key = key or uuid.uuid4().hex
    return post(client, "/api/v1/orders/", order_request(lines, **kwargs), key=key), key


def assert_replayed(first, again):
    assert again.status_code == first.status_code
    assert again.content == first.content
    assert again["Idempotent-Replayed"] == "true"


def counters(sku):
    stock = StockItem.objects.get(product__sku=sku)
    return stock.on_hand, stock.reserved


def charges(provider, order):
    return [
        op
        for op in provider.ledger()
        if op["kind"] == "capture"
        and op["status"] == "succeeded"
        and op["key"].endswith(f":order-{order.number}:capture")
    ]


def books_balance():
    assert inventory_selectors.stock_drift() == []
    assert not Reservation.objects.filter(
        state="held", order_line__order__status__in=["confirmed", "payment_failed", "expired"]
    ).exists()


@pytest.fixture
def catalog(make_product):
    make_product("TEE-M", price="19.99", stock=5)
    make_product("MUG", price="7.50", stock=2)
    make_product("CAP", price="12.00", stock=0)


@pytest.fixture
def shopper_api(shopper_client, provider, catalog):
    return shopper_client


# -- every line fully reserved ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["reject", "partial", "ask"])
def test_fully_reservable_is_confirmed_and_charged_once_in_every_mode(shopper_api, provider, mode):
    response, key = place(shopper_api, {"TEE-M": 2, "MUG": 1}, on_shortage=mode)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "confirmed"
    assert body["total"] == "47.48" and body["currency"] == "EUR"
    assert body["payment"] == {
        "status": "captured",
        "amount_captured": "47.48",
        "amount_refunded": "0.00",
    }
    assert [line["status"] for line in body["lines"]] == ["confirmed", "confirmed"]
    assert counters("TEE-M") == (3, 0) and counters("MUG") == (1, 0)

    again, _ = place(shopper_api, {"TEE-M": 2, "MUG": 1}, on_shortage=mode, key=key)
    assert_replayed(response, again)
    order = Order.objects.get()
    assert len(charges(provider, order)) == 1
    assert counters("TEE-M") == (3, 0)
    assert OutboxMessage.objects.filter(event_type="order.confirmed").count() == 1
    books_balance()
    assert_reconciled()


def test_detail_matches_the_answer(shopper_api):
    response, _ = place(shopper_api, {"TEE-M": 1})
    detail = shopper_api.get(f"/api/v1/orders/{response.json()['id']}/")
    assert detail.json() == response.json()


# -- nothing reservable / reject ----------------------------------------------------------


@pytest.mark.parametrize("mode", ["reject", "partial", "ask"])
def test_nothing_reservable_is_409_in_every_mode_and_replayed(shopper_api, mode):
    response, key = place(shopper_api, {"CAP": 1}, on_shortage=mode)
    body = assert_problem(response, 409, "insufficient_stock")
    assert body["errors"]["lines"] == [{"index": 0, "sku": "CAP", "requested": 1, "available": 0}]
    assert_replayed(response, place(shopper_api, {"CAP": 1}, on_shortage=mode, key=key)[0])
    assert not Order.objects.exists() and not Payment.objects.exists()


def test_reject_with_a_shortage_resets_every_flag(shopper_api):
    response, key = place(shopper_api, {"TEE-M": 2, "MUG": 3}, on_shortage="reject")
    body = assert_problem(response, 409, "insufficient_stock")
    assert body["errors"]["lines"] == [{"index": 1, "sku": "MUG", "requested": 3, "available": 2}]
    assert counters("TEE-M") == (5, 0) and counters("MUG") == (2, 0)
    assert_replayed(response, place(shopper_api, {"TEE-M": 2, "MUG": 3}, key=key)[0])
    assert not Order.objects.exists() and not Reservation.objects.exists()


# -- partial --------------------------------------------------------------------------------


def test_partial_confirms_and_charges_what_was_reserved(shopper_api, provider):
    response, key = place(shopper_api, {"TEE-M": 2, "MUG": 3, "CAP": 1}, on_shortage="partial")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "partially_confirmed"
    assert [
        (line["sku"], line["quantity_requested"], line["quantity_confirmed"], line["status"])
        for line in body["lines"]
    ] == [
        ("TEE-M", 2, 2, "confirmed"),
        ("MUG", 3, 2, "confirmed"),
        ("CAP", 1, 0, "unavailable"),
    ]
    assert body["total"] == "54.98"
    assert body["payment"]["amount_captured"] == "54.98"
    order = Order.objects.get()
    assert [op["amount"] for op in charges(provider, order)] in (["54.98"], [Decimal("54.98")])
    assert counters("MUG") == (0, 0)
    assert_replayed(
        response,
        place(shopper_api, {"TEE-M": 2, "MUG": 3, "CAP": 1}, on_shortage="partial", key=key)[0],
    )
    assert OutboxMessage.objects.filter(event_type="order.partially_confirmed").count() == 1
    books_balance()


# -- ask --------------------------------------------------------------------------------------


@pytest.fixture
def asked(shopper_api):
    response, _ = place(shopper_api, {"TEE-M": 1, "MUG": 3}, on_shortage="ask")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "awaiting_decision"
    assert body["reservation_expires_at"]
    assert body["payment"]["status"] == "none"
    assert body["total"] == "34.99"
    assert counters("MUG") == (2, 2)
    assert not Payment.objects.exists()
    return body


def test_ask_then_confirm_charges_what_is_reserved(shopper_api, asked, provider):
    url = f"/api/v1/orders/{asked['id']}/confirm/"
    response = post(shopper_api, url, key="confirm-1")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "partially_confirmed"
    assert response.json()["payment"]["amount_captured"] == "34.99"
    assert_replayed(response, post(shopper_api, url, key="confirm-1"))
    # A confirm under a fresh key answers the current state; still one charge.
    again = post(shopper_api, url, key="confirm-2")
    assert again.status_code == 200 and again.json()["status"] == "partially_confirmed"
    assert len(charges(provider, Order.objects.get())) == 1
    assert counters("MUG") == (0, 0) and counters("TEE-M") == (4, 0)
    books_balance()


def test_ask_then_cancel_resets_the_flags(shopper_api, asked):
    url = f"/api/v1/orders/{asked['id']}/cancel/"
    response = post(shopper_api, url, key="cancel-1")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "cancelled"
    assert [line["status"] for line in response.json()["lines"]] == ["cancelled", "cancelled"]
    assert counters("MUG") == (2, 0) and counters("TEE-M") == (5, 0)
    assert_replayed(response, post(shopper_api, url, key="cancel-1"))
    assert post(shopper_api, url, key="cancel-2").json()["status"] == "cancelled"
    assert_problem(
        post(shopper_api, f"/api/v1/orders/{asked['id']}/confirm/", key="c"), 409, "invalid_state"
    )
    assert OutboxMessage.objects.filter(event_type="order.cancelled").count() == 1
    books_balance()


def test_ask_then_nothing_expires(shopper_api, asked):
    Order.objects.update(reservation_expires_at=Now() - timedelta(seconds=1))
    assert expire_reservations.apply().get() == 1
    detail = shopper_api.get(f"/api/v1/orders/{asked['id']}/").json()
    assert detail["status"] == "expired"
    assert counters("MUG") == (2, 0)
    url = f"/api/v1/orders/{asked['id']}/confirm/"
    response = post(shopper_api, url, key="late")
    assert_problem(response, 409, "reservation_expired")
    assert_replayed(response, post(shopper_api, url, key="late"))
    assert OutboxMessage.objects.filter(event_type="order.expired").count() == 1
    assert not Payment.objects.exists()
    books_balance()


def test_confirm_after_the_deadline_before_the_sweep_is_409_and_expires(shopper_api, asked):
    Order.objects.update(reservation_expires_at=Now() - timedelta(seconds=1))
    response = post(shopper_api, f"/api/v1/orders/{asked['id']}/confirm/", key="late")
    body = assert_problem(response, 409, "reservation_expired")
    assert body["order_id"] == asked["id"]
    assert Order.objects.get().status == "expired"
    assert counters("MUG") == (2, 0)
    assert expire_reservations.apply().get() == 0


def test_confirm_declined_is_402_and_resets(shopper_api, make_product, provider):
    response, _ = place(shopper_api, {"MUG": 3}, on_shortage="ask", method="pm_card_declined")
    order_id = response.json()["id"]
    confirm = post(shopper_api, f"/api/v1/orders/{order_id}/confirm/", key="k")
    body = assert_problem(confirm, 402, "payment_declined")
    assert body["order_id"] == order_id
    assert counters("MUG") == (2, 0)


def test_others_cannot_confirm_or_cancel(client_for, make_user, asked):
    stranger = client_for(make_user())
    for action in ("confirm", "cancel"):
        response = post(stranger, f"/api/v1/orders/{asked['id']}/{action}/", key="x")
        assert_problem(response, 404, "not_found")
    assert not IdempotencyKey.objects.filter(owner__username=stranger.user.username).exists()


def test_staff_cannot_confirm_someone_elses_order(staff_client, shopper_api, asked, provider):
    """Confirming charges the shopper: their decision alone. Staff are refused, nothing stored."""
    url = f"/api/v1/orders/{asked['id']}/confirm/"
    assert staff_client.get(f"/api/v1/orders/{asked['id']}/").status_code == 200
    assert_problem(post(staff_client, url, key="staff-confirm"), 403, "permission_denied")
    order = Order.objects.get()
    assert order.status == "awaiting_decision" and order.payment_id is None
    assert not Payment.objects.exists() and charges(provider, order) == []
    assert counters("MUG") == (2, 2)
    # Refused before the key is claimed: the same key is free for a later request.
    assert not IdempotencyKey.objects.filter(owner_id=staff_client.user.pk).exists()

    response = post(shopper_api, url, key="owner-confirm")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "partially_confirmed"
    assert len(charges(provider, order)) == 1


def test_staff_may_still_cancel_someone_elses_order(staff_client, asked):
    response = post(staff_client, f"/api/v1/orders/{asked['id']}/cancel/", key="staff-cancel")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "cancelled"
    assert counters("MUG") == (2, 0)


# -- payment declined ---------------------------------------------------------------------------


def test_declined_is_402_with_order_id_and_flags_reset(shopper_api, provider):
    response, key = place(shopper_api, {"TEE-M": 2}, method="pm_card_declined")
    body = assert_problem(response, 402, "payment_declined")
    order = Order.objects.get()
    assert body["order_id"] == str(order.id)
    assert order.status == "payment_failed"
    assert counters("TEE-M") == (5, 0)
    assert_replayed(
        response, place(shopper_api, {"TEE-M": 2}, method="pm_card_declined", key=key)[0]
    )
    detail = shopper_api.get(f"/api/v1/orders/{order.id}/").json()
    assert detail["payment"]["status"] == "failed"
    assert [line["status"] for line in detail["lines"]] == ["released"]
    assert OutboxMessage.objects.filter(event_type="order.payment_failed").count() == 1
    assert charges(provider, order) == []
    books_balance()


# -- outcome unknown -------------------------------------------------------------------------------


def test_timeout_is_202_pending_then_a_retry_finds_the_charge(shopper_api, provider):
    response, key = place(shopper_api, {"TEE-M": 2}, method="pm_card_timeout")
    assert response.status_code == 202, response.content
    assert response.json()["status"] == "payment_pending"
    assert response.json()["payment"]["status"] == "pending"
    assert "Idempotent-Replayed" not in response
    assert counters("TEE-M") == (5, 2)
    # Held while the outcome is unknown, whatever the clock says.
    assert set(Reservation.objects.values_list("state", "expires_at")) == {("held", None)}

    retry, _ = place(shopper_api, {"TEE-M": 2}, method="pm_card_timeout", key=key)
    assert retry.status_code == 201, retry.content
    assert retry.json()["status"] == "confirmed"
    assert "Idempotent-Replayed" not in retry
    assert_replayed(retry, place(shopper_api, {"TEE-M": 2}, method="pm_card_timeout", key=key)[0])
    order = Order.objects.get()
    assert len(charges(provider, order)) == 1
    assert counters("TEE-M") == (3, 0)
    books_balance()
    assert_reconciled()


def test_unavailable_is_202_then_settlement_confirms_and_the_retry_is_final(shopper_api, provider):
    response, key = place(shopper_api, {"TEE-M": 1}, method="pm_card_unavailable")
    assert response.status_code == 202, response.content
    # A retry asks the provider once: it never got the charge (503), still pending.
    retry, _ = place(shopper_api, {"TEE-M": 1}, method="pm_card_unavailable", key=key)
    assert retry.status_code == 202 and retry.json()["status"] == "payment_pending"

    order = Order.objects.get()
    settle_due(order.payment)  # re-sent under the same key: the 2nd 503
    assert Order.objects.get().status == "payment_pending"
    settle_due(order.payment)  # the 3rd attempt goes through; the handler confirms
    assert Order.objects.get().status == "confirmed"
    assert counters("TEE-M") == (4, 0)

    final, _ = place(shopper_api, {"TEE-M": 1}, method="pm_card_unavailable", key=key)
    assert final.status_code == 201 and final.json()["status"] == "confirmed"
    assert_replayed(
        final, place(shopper_api, {"TEE-M": 1}, method="pm_card_unavailable", key=key)[0]
    )
    assert len(charges(provider, order)) == 1
    books_balance()
    assert_reconciled()


def test_pending_without_a_retry_settles_and_the_completer_closes_the_key(
    shopper_api, provider, settings
):
    response, key = place(shopper_api, {"TEE-M": 1}, method="pm_card_timeout")
    assert response.status_code == 202
    order = Order.objects.get()
    settle_due(order.payment)
    assert Order.objects.get().status == "confirmed"
    settings.IDEMPOTENCY_ABANDON_AFTER = 0
    IdempotencyKey.objects.update(last_run_at=Now() - timedelta(seconds=1))
    assert keys_complete_abandoned() == 1
    row = IdempotencyKey.objects.get(key=key)
    assert row.recovery_point == "finished" and row.response_status == 201
    replay, _ = place(shopper_api, {"TEE-M": 1}, method="pm_card_timeout", key=key)
    assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"
    books_balance()


def test_confirm_with_timeout_is_202_then_200(shopper_api, provider):
    response, _ = place(shopper_api, {"MUG": 3}, on_shortage="ask", method="pm_card_timeout")
    url = f"/api/v1/orders/{response.json()['id']}/confirm/"
    pending = post(shopper_api, url, key="c1")
    assert pending.status_code == 202 and pending.json()["status"] == "payment_pending"
    assert_problem(
        post(shopper_api, url.replace("confirm", "cancel"), key="x"), 409, "payment_pending"
    )
    final = post(shopper_api, url, key="c1")
    assert final.status_code == 200 and final.json()["status"] == "partially_confirmed"
    assert_replayed(final, post(shopper_api, url, key="c1"))


# -- cancel table rows available now ---------------------------------------------------------------


def test_cancel_a_confirmed_order_is_202_cancelling(shopper_api):
    response, _ = place(shopper_api, {"TEE-M": 1})
    cancel = post(shopper_api, f"/api/v1/orders/{response.json()['id']}/cancel/", key="k")
    assert cancel.status_code == 202 and cancel.json()["status"] == "cancelling"
    assert_replayed(
        cancel, post(shopper_api, f"/api/v1/orders/{response.json()['id']}/cancel/", key="k")
    )


# -- bad input -------------------------------------------------------------------------------------


def test_price_changed_is_409_and_nothing_reserved(shopper_api):
    response, key = place(shopper_api, {"TEE-M": 2}, expected_total="39.97")
    body = assert_problem(response, 409, "price_changed")
    assert body["total"] == "39.98"
    assert counters("TEE-M") == (5, 0)
    assert_replayed(response, place(shopper_api, {"TEE-M": 2}, expected_total="39.97", key=key)[0])
    ok, _ = place(shopper_api, {"TEE-M": 2}, expected_total="39.98")
    assert ok.status_code == 201


@pytest.mark.parametrize(
    "change",
    [
        {"lines": [{"sku": "NOPE", "quantity": 1}]},
        {"lines": [{"sku": "TEE-M", "quantity": 1001}]},
        {"lines": [{"sku": "TEE-M", "quantity": "1"}]},
        {"lines": [{"sku": "TEE-M", "quantity": 1}, {"sku": "TEE-M", "quantity": 1}]},
        {"lines": []},
        {"lines": {"sku": "TEE-M", "quantity": 1}},
        {"on_shortage": "maybe"},
        {"shipping_address": {"name": "x"}},
        {"payment_method": "pm_card_stolen"},
        {"expected_total": 39.98},
    ],
    ids=[
        "unknown-sku",
        "quantity",
        "quantity-string",
        "repeated",
        "empty",
        "not-a-list",
        "on-shortage",
        "address",
        "method",
        "total-number",
    ],
)
def test_bad_input_is_400_nothing_stored_and_the_key_reusable(shopper_api, change):
    key = uuid.uuid4().hex
    bad = {**order_request({"TEE-M": 1}), **change}
    assert_problem(post(shopper_api, "/api/v1/orders/", bad, key=key), 400, "invalid_request")
    assert not IdempotencyKey.objects.exists()
    assert counters("TEE-M") == (5, 0) and not Order.objects.exists()
    good = post(shopper_api, "/api/v1/orders/", order_request({"TEE-M": 1}), key=key)
    assert good.status_code == 201


def test_other_currency_is_422_and_nothing_stored(shopper_api):
    body = {**order_request({"TEE-M": 1}), "currency": "USD"}
    assert_problem(post(shopper_api, "/api/v1/orders/", body, key="k"), 422, "currency_mismatch")
    assert not IdempotencyKey.objects.exists()


def test_key_rules_apply(shopper_api, api_client):
    assert_problem(
        shopper_api.post("/api/v1/orders/", order_request({"TEE-M": 1}), format="json"),
        400,
        "idempotency_key_missing",
    )
    assert_problem(
        api_client.post("/api/v1/orders/", order_request({"TEE-M": 1}), format="json"),
        401,
        "not_authenticated",
    )
    first, key = place(shopper_api, {"TEE-M": 1})
    assert first.status_code == 201
    reused = post(shopper_api, "/api/v1/orders/", order_request({"TEE-M": 2}), key=key)
    assert_problem(reused, 422, "idempotency_key_reused")


def test_same_key_from_another_shopper_is_independent(shopper_api, client_for, make_user):
    first, key = place(shopper_api, {"TEE-M": 1})
    other = client_for(make_user())
    second, _ = place(other, {"TEE-M": 1}, key=key)
    assert second.status_code == 201 and "Idempotent-Replayed" not in second
    assert second.json()["id"] != first.json()["id"]
    assert Order.objects.count() == 2


# -- staff stock endpoint ------------------------------------------------------------------------


def test_stock_adjust_is_keyed_and_refuses_going_below_reserved(staff_client, shopper_api):
    url = "/api/v1/products/MUG/stock/"
    response = post(staff_client, url, {"delta": 3}, key="s1")
    assert response.status_code == 200, response.content
    assert response.json() == {"sku": "MUG", "on_hand": 5, "reserved": 0, "available": 5}
    assert_replayed(response, post(staff_client, url, {"delta": 3}, key="s1"))
    assert counters("MUG") == (5, 0)

    place(shopper_api, {"MUG": 4, "CAP": 1}, on_shortage="ask")  # holds 4, awaits
    refused = post(staff_client, url, {"set": 3}, key="s2")
    body = assert_problem(refused, 409, "stock_below_reserved")
    assert body["reserved"] == 4
    assert_replayed(refused, post(staff_client, url, {"set": 3}, key="s2"))
    assert post(staff_client, url, {"set": 4}, key="s3").json()["available"] == 0


@pytest.mark.parametrize(
    "body", [{}, {"delta": 1, "set": 2}, {"delta": "1"}, {"set": -1}, {"amount": 1}], ids=repr
)
def test_stock_adjust_bad_input(staff_client, catalog, body):
    response = post(staff_client, "/api/v1/products/MUG/stock/", body, key="k")
    assert_problem(response, 400, "invalid_request")
    assert not IdempotencyKey.objects.exists()


def test_stock_adjust_is_staff_only(shopper_client, api_client, staff_client, catalog):
    url = "/api/v1/products/MUG/stock/"
    assert_problem(post(shopper_client, url, {"delta": 1}, key="k"), 403, "permission_denied")
    assert_problem(post(api_client, url, {"delta": 1}, key="k"), 401, "not_authenticated")
    assert_problem(post(staff_client, url, {"delta": 1}), 400, "idempotency_key_missing")
    assert_problem(
        post(staff_client, "/api/v1/products/NOPE/stock/", {"delta": 1}, key="k"), 404, "not_found"
    )


# -- confirm racing expiry through the API ---------------------------------------------------------


def _db_clock():
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def test_confirm_racing_expiry_one_wins_and_its_answer_is_replayed(shopper_api, asked):
    """The confirm starts before the deadline, the sweep after it, both queued on the order row."""
    order_id = asked["id"]
    Order.objects.filter(id=order_id).update(reservation_expires_at=Now() + timedelta(seconds=1))
    deadline = Order.objects.get(id=order_id).reservation_expires_at
    url = f"/api/v1/orders/{order_id}/confirm/"
    workers = Workers()
    with transaction.atomic():
        Order.objects.select_for_update().get(id=order_id)
        workers.start(post, shopper_api, url, key="race")
        wait_for_lock_waiters(1)
        assert _db_clock() < deadline, "the confirm must be queued before the deadline"
        wait_until(lambda: _db_clock() > deadline, what="the deadline to pass")
        workers.start(order_expire, order_id=order_id)
        wait_for_lock_waiters(2)
    results = workers.join()

    response = next(r for r in results if not isinstance(r, bool))
    expired = next(r for r in results if isinstance(r, bool))
    order = Order.objects.get(id=order_id)
    if expired:
        assert order.status == "expired"
        assert_problem(response, 409, "reservation_expired")
        assert counters("MUG") == (2, 0)
    else:
        assert response.status_code == 200, response.content
        assert order.status == "partially_confirmed"
        assert counters("MUG") == (0, 0)
    assert_replayed(response, post(shopper_api, url, key="race"))
    books_balance()


# -- the bench's unkeyed baseline -----------------------------------------------------------


def test_unkeyed_variant_runs_the_same_checkout_without_a_key(shopper_api, provider):
    """`/_test/orders-unkeyed/` (bench only): same phases and answer, nothing stored under a key."""
    response = shopper_api.post(
        "/api/v1/_test/orders-unkeyed/", order_request({"TEE-M": 2}), format="json"
    )
    assert response.status_code == 201, response.content
    assert "Idempotent-Replayed" not in response
    body = response.json()
    assert body["status"] == "confirmed" and body["payment"]["status"] == "captured"
    assert shopper_api.get(f"/api/v1/orders/{body['id']}/").json() == body
    assert not IdempotencyKey.objects.exists()
    assert len(charges(provider, Order.objects.get())) == 1
    assert counters("TEE-M") == (3, 0)
    books_balance()
