"""Shipments: counted under the order's row lock, fulfillment follows, cancel refuses shipped."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction
from django.db.models import Sum

from core.errors import InvalidRequest
from idempotency import failpoints
from idempotency.models import IdempotencyKey, OutboxMessage
from orders.models import Order, OrderEvent, OrderLine, Shipment, ShipmentLine
from orders.shipments import ExceedsUnshipped, OrderNotShippable
from tests.concurrency import Workers, wait_for_lock_waiters
from tests.conftest import assert_problem
from tests.orders.shipping import confirm, ship

URL = "/api/v1/orders/{}/shipments/"


@pytest.fixture
def confirmed(make_product, reserve):
    make_product("TEE-M", price="19.99", stock=10)
    make_product("MUG", price="7.50", stock=10)
    return confirm(reserve({"TEE-M": 3, "MUG": 2}))


def post(client, order, body, key):
    return client.post(URL.format(order.id), body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def lines_of(order) -> dict[str, int]:
    return dict(OrderLine.objects.filter(order=order).values_list("sku", "quantity_shipped"))


# --- API ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_ship_some_then_the_rest(staff_client, confirmed):
    first = post(staff_client, confirmed, {"lines": [{"sku": "TEE-M", "quantity": 2}]}, "s-1")
    assert first.status_code == 201, first.content
    body = first.json()
    assert body["order_id"] == str(confirmed.id)
    assert body["lines"] == [{"sku": "TEE-M", "quantity": 2}]
    assert body["carrier"] is None and body["tracking_number"] is None
    assert lines_of(confirmed) == {"TEE-M": 2, "MUG": 0}
    order = staff_client.get(f"/api/v1/orders/{confirmed.id}/").json()
    assert order["fulfillment"] == "partially_shipped"
    assert {line["sku"]: line["quantity_shipped"] for line in order["lines"]} == lines_of(confirmed)

    # No lines: everything confirmed and not yet shipped.
    rest = post(staff_client, confirmed, {"carrier": "DHL", "tracking_number": "JD01"}, "s-2")
    assert rest.status_code == 201, rest.content
    assert sorted(map(tuple, (d.values() for d in rest.json()["lines"]))) == [
        ("MUG", 2),
        ("TEE-M", 1),
    ]
    assert rest.json()["carrier"] == "DHL" and rest.json()["tracking_number"] == "JD01"
    assert Order.objects.get(id=confirmed.id).fulfillment == "shipped"
    assert lines_of(confirmed) == {"TEE-M": 3, "MUG": 2}

    events = OrderEvent.objects.filter(order=confirmed, kind="shipped").order_by("id")
    assert [(e.from_status, e.to_status) for e in events] == [
        ("unfulfilled", "partially_shipped"),
        ("partially_shipped", "shipped"),
    ]
    assert OutboxMessage.objects.filter(event_type="order.shipment_created").count() == 2

    # Nothing left: 422, nothing stored.
    more = post(staff_client, confirmed, {}, "s-3")
    assert_problem(more, 422, "exceeds_unshipped")
    assert Shipment.objects.count() == 2


@pytest.mark.django_db
def test_same_key_replays_and_ships_once(staff_client, confirmed):
    body = {"lines": [{"sku": "MUG", "quantity": 1}]}
    first = post(staff_client, confirmed, body, "same")
    again = post(staff_client, confirmed, body, "same")
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert Shipment.objects.count() == 1
    assert lines_of(confirmed)["MUG"] == 1


@pytest.mark.django_db
def test_more_than_unshipped_is_422_and_stored_nothing_shipped(staff_client, confirmed):
    response = post(staff_client, confirmed, {"lines": [{"sku": "TEE-M", "quantity": 4}]}, "k")
    problem = assert_problem(response, 422, "exceeds_unshipped")
    assert problem["errors"]["lines"] == [
        {"index": 0, "sku": "TEE-M", "requested": 4, "unshipped": 3}
    ]
    assert not Shipment.objects.exists() and not ShipmentLine.objects.exists()
    assert lines_of(confirmed) == {"TEE-M": 0, "MUG": 0}
    # The domain's refusal is the key's stored answer.
    replay = post(staff_client, confirmed, {"lines": [{"sku": "TEE-M", "quantity": 4}]}, "k")
    assert replay.status_code == 422 and replay["Idempotent-Replayed"] == "true"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body",
    [
        {"lines": [{"sku": "TEE-M", "quantity": 0}]},
        {"lines": [{"sku": "TEE-M", "quantity": -1}]},
        {"lines": [{"sku": "TEE-M", "quantity": "1"}]},
        {"lines": [{"sku": "TEE-M", "quantity": 1}, {"sku": "TEE-M", "quantity": 1}]},
        {"lines": []},
        {"lines": [{"sku": "TEE-M"}]},
        {"lines": [{"sku": "TEE-M", "quantity": 1}], "colour": "red"},
        ["not", "an", "object"],
    ],
)
def test_bad_bodies_are_400_and_claim_nothing(staff_client, confirmed, body):
    response = post(staff_client, confirmed, body, "bad")
    assert_problem(response, 400, "invalid_request")
    assert not Shipment.objects.exists()
    assert not IdempotencyKey.objects.exists()


@pytest.mark.django_db
def test_sku_not_in_the_order_is_400_nothing_stored(staff_client, confirmed, make_product):
    make_product("CAP", stock=5)
    response = post(staff_client, confirmed, {"lines": [{"sku": "CAP", "quantity": 1}]}, "cap")
    problem = assert_problem(response, 400, "invalid_request")
    assert problem["errors"] == {"lines": {"0": {"sku": ["Not a line of this order."]}}}
    assert not Shipment.objects.exists()
    assert not IdempotencyKey.objects.exists()  # a 400 releases the key: correct and resend


@pytest.mark.django_db
def test_an_order_that_is_not_confirmed_cannot_ship(staff_client, make_product, reserve):
    make_product("TEE-M", stock=10)
    pending = reserve({"TEE-M": 1})
    response = post(staff_client, pending, {}, "pending")
    assert_problem(response, 409, "invalid_state")
    assert not Shipment.objects.exists()
    assert lines_of(pending) == {"TEE-M": 0}


@pytest.mark.django_db
def test_shoppers_may_not_ship_and_unknown_orders_are_404(shopper_client, staff_client, confirmed):
    assert_problem(post(shopper_client, confirmed, {}, "mine"), 403, "permission_denied")
    response = staff_client.post(
        URL.format("00000000-0000-0000-0000-000000000000"),
        {},
        format="json",
        HTTP_IDEMPOTENCY_KEY="nobody",
    )
    assert_problem(response, 404, "not_found")
    missing = staff_client.post(URL.format(confirmed.id), {}, format="json")
    assert_problem(missing, 400, "idempotency_key_missing")
    assert not Shipment.objects.exists()


@pytest.mark.django_db
def test_cancel_of_a_shipped_order_is_409_order_shipped(shopper_client, confirmed):
    ship(confirmed, {"MUG": 1})
    response = shopper_client.post(
        f"/api/v1/orders/{confirmed.id}/cancel/", format="json", HTTP_IDEMPOTENCY_KEY="c"
    )
    assert_problem(response, 409, "order_shipped")
    assert Order.objects.get(id=confirmed.id).status == "confirmed"


# --- Service ------------------------------------------------------------------------


@pytest.mark.django_db
def test_service_refusals_write_nothing(confirmed, make_product):
    with pytest.raises(ExceedsUnshipped):
        ship(confirmed, {"TEE-M": 1, "MUG": 3})
    with pytest.raises(InvalidRequest):
        ship(confirmed, {"NOPE": 1})
    assert not Shipment.objects.exists()
    assert not OrderEvent.objects.filter(kind="shipped").exists()
    assert lines_of(confirmed) == {"TEE-M": 0, "MUG": 0}


@pytest.mark.django_db
def test_unavailable_lines_do_not_keep_an_order_unfulfilled(make_product, reserve):
    make_product("TEE-M", stock=10)
    make_product("MUG", stock=0)
    make_product("CAP", stock=1)
    partial = confirm(reserve({"TEE-M": 2, "MUG": 1, "CAP": 2}, on_shortage="partial"))
    assert partial.status == "partially_confirmed"
    shipment = ship(partial)
    assert sorted((line.sku, line.quantity) for line in shipment.line_list) == [
        ("CAP", 1),
        ("TEE-M", 2),
    ]
    assert Order.objects.get(id=partial.id).fulfillment == "shipped"
    with pytest.raises(OrderNotShippable):
        ship(reserve({"TEE-M": 1}))


# --- Races --------------------------------------------------------------------------


def _race(target, order, *, overlap_on_lock: bool):
    """Run `target(order)` in two threads released together; return (results, errors)."""
    barrier = threading.Barrier(2)
    outcomes: list = []
    lock = threading.Lock()

    def contender():
        barrier.wait(timeout=10)
        try:
            result = target(order)
        except Exception as exc:  # noqa: BLE001 - the outcome is what we assert on
            result = exc
        finally:
            connection.close()
        with lock:
            outcomes.append(result)

    workers = Workers()
    first_in = threading.Event()

    def hold_first(_name):
        # The first contender holding the order's lock waits until the other
        # one queues on it: the overlap is proved, not hoped for.
        if not first_in.is_set():
            first_in.set()
            wait_for_lock_waiters(1)

    hook = failpoints.hook("shipment.create.locked", hold_first) if overlap_on_lock else None
    if hook is not None:
        hook.__enter__()
    try:
        workers.start(contender)
        workers.start(contender)
        workers.join()
    finally:
        if hook is not None:
            hook.__exit__(None, None, None)
    return outcomes


@pytest.mark.django_db(transaction=True)
def test_two_shipments_racing_for_the_same_units_one_wins(confirmed):
    outcomes = _race(lambda order: ship(order, {"TEE-M": 2}), confirmed, overlap_on_lock=True)
    shipped = [o for o in outcomes if isinstance(o, Shipment)]
    refused = [o for o in outcomes if isinstance(o, ExceedsUnshipped)]
    assert len(shipped) == 1 and len(refused) == 1, outcomes
    line = OrderLine.objects.get(order=confirmed, sku="TEE-M")
    assert line.quantity_shipped == 2 <= line.quantity_confirmed
    total = ShipmentLine.objects.filter(order_line=line).aggregate(units=Sum("quantity"))
    assert total["units"] == line.quantity_shipped


@pytest.mark.django_db(transaction=True)
def test_two_api_shipments_racing_one_201_one_422(confirmed, make_user, client_for):
    staff = client_for(make_user(actions=True))
    barrier = threading.Barrier(2)

    def contender(key):
        barrier.wait(timeout=10)
        try:
            body = {"lines": [{"sku": "MUG", "quantity": 2}]}
            return post(staff, confirmed, body, key).status_code
        finally:
            connection.close()

    workers = Workers()
    workers.start(contender, "race-a")
    workers.start(contender, "race-b")
    assert sorted(workers.join()) == [201, 422]
    assert OrderLine.objects.get(order=confirmed, sku="MUG").quantity_shipped == 2


def _ship_unlocked(order, *, sku: str, quantity: int, barrier: threading.Barrier) -> Shipment:
    """The deliberately wrong twin: read, check, write back, without the order's lock."""
    with transaction.atomic():
        line = OrderLine.objects.get(order=order, sku=sku)
        unshipped = line.quantity_confirmed - line.quantity_shipped
        barrier.wait(timeout=10)  # both have read the same quantity_shipped
        if quantity > unshipped:
            raise ExceedsUnshipped("more than unshipped")
        shipment = Shipment.objects.create(order=order)
        ShipmentLine.objects.create(shipment=shipment, order_line=line, sku=sku, quantity=quantity)
        line.quantity_shipped = line.quantity_shipped + quantity  # read-modify-write
        line.save(update_fields=["quantity_shipped"])
        return shipment


@pytest.mark.django_db(transaction=True)
def test_the_unlocked_twin_oversells(confirmed):
    """Without the lock both shipments pass: 4 units leave for 3 confirmed (a lost update)."""
    barrier = threading.Barrier(2)
    outcomes = _race(
        lambda order: _ship_unlocked(order, sku="TEE-M", quantity=2, barrier=barrier),
        confirmed,
        overlap_on_lock=False,
    )
    assert all(isinstance(o, Shipment) for o in outcomes), outcomes
    line = OrderLine.objects.get(order=confirmed, sku="TEE-M")
    shipped = ShipmentLine.objects.filter(order_line=line).aggregate(units=Sum("quantity"))
    assert shipped["units"] == 4 > line.quantity_confirmed == 3
    assert line.quantity_shipped == 2  # the counter lost one of the two updates
