"""Returns through the API: strict input, keyed, counted under the row lock, received once."""

from __future__ import annotations

import threading

import pytest
from celery import current_app
from django.db import transaction
from django.db.models.functions import Now

from idempotency.failpoints import failpoint, hook
from idempotency.models import IdempotencyKey
from orders.models import CompensationStep, OrderEvent, ReturnRequest
from orders.returns import return_receive
from orders.states import ReturnStatus
from tests.conftest import assert_problem
from tests.orders.compensation_support import (
    RETURN,
    ask_return,
    paid_order,
    receive,
    shipped_order,
)
from tests.orders.shipping import ship

pytestmark = pytest.mark.django_db(transaction=True)


def return_receive_wrong_twin(*, return_id, by=None) -> bool:
    """DELIBERATELY WRONG (tests only): check the status, then update it unconditionally.

    Two callers both read `requested`, both update, both believe they
    started the compensation. Returns True when this caller "won".
    """
    with transaction.atomic():
        status = ReturnRequest.objects.values_list("status", flat=True).get(id=return_id)
        failpoint("returns.receive.before_decide")
        if status != ReturnStatus.REQUESTED:
            return False
        ReturnRequest.objects.filter(id=return_id).update(
            status=ReturnStatus.PROCESSING, received_at=Now(), updated_at=Now()
        )
        return True


@pytest.fixture(autouse=True)
def bells(monkeypatch):
    """No broker in these tests: the bells are recorded, the rows are the truth."""
    rung: list = []
    monkeypatch.setattr(current_app, "send_task", lambda name, args=None, **kw: rung.append(args))
    return rung


@pytest.fixture
def order(provider, make_product, shopper_client):
    make_product("TEE-M", price="10.00", stock=10)
    make_product("CAP", price="5.50", stock=10)
    return shipped_order(shopper_client, {"TEE-M": 2, "CAP": 1})


def test_return_is_requested_with_its_body(order, shopper_client):
    response = ask_return(shopper_client, order, {"TEE-M": 1})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "requested"
    assert body["order_id"] == str(order.id)
    assert body["lines"] == [{"sku": "TEE-M", "quantity": 1}]
    assert body["refund_amount"] == "10.00"
    assert body["steps"] == []
    again = ask_return(shopper_client, order, {"TEE-M": 1})
    assert again.json() == body and again["Idempotent-Replayed"] == "true"
    assert ReturnRequest.objects.count() == 1
    assert shopper_client.get(RETURN.format(body["id"])).json() == body


@pytest.mark.parametrize(
    ("payload", "status", "code"),
    [
        ({"lines": [], "reason": "x"}, 400, "invalid_request"),
        ({"lines": [{"sku": "TEE-M", "quantity": 0}], "reason": "x"}, 400, "invalid_request"),
        ({"lines": [{"sku": "NOPE", "quantity": 1}], "reason": "x"}, 400, "invalid_request"),
        ({"lines": [{"sku": "TEE-M", "quantity": 3}], "reason": "x"}, 422, "return_exceeds_order"),
    ],
)
def test_bad_returns_store_nothing(order, shopper_client, payload, status, code):
    response = shopper_client.post(
        f"/api/v1/orders/{order.id}/returns/", payload, format="json", HTTP_IDEMPOTENCY_KEY="k"
    )
    assert_problem(response, status, code)
    assert ReturnRequest.objects.count() == 0
    assert CompensationStep.objects.count() == 0
    if status == 400:  # nothing stored under the key: a corrected body may use it
        assert not IdempotencyKey.objects.filter(key="k").exists()
        assert ask_return(shopper_client, order, {"TEE-M": 1}, key="k").status_code == 201


def test_unshipped_line_and_others_order(
    provider, make_product, shopper_client, client_for, make_user
):
    make_product("TEE-M", price="10.00", stock=10)
    make_product("CAP", price="5.50", stock=10)
    order = paid_order(shopper_client, {"TEE-M": 2, "CAP": 1})
    ship(order, {"TEE-M": 2})
    assert_problem(ask_return(shopper_client, order, {"CAP": 1}), 422, "line_not_shipped")
    stranger = client_for(make_user())
    assert_problem(ask_return(stranger, order, {"TEE-M": 1}), 404, "not_found")
    assert ReturnRequest.objects.count() == 0


def test_returnable_counts_returned_and_open_returns(order, shopper_client):
    assert ask_return(shopper_client, order, {"TEE-M": 1}, key="a").status_code == 201
    assert ask_return(shopper_client, order, {"TEE-M": 1}, key="b").status_code == 201
    problem = assert_problem(
        ask_return(shopper_client, order, {"TEE-M": 1}, key="c"), 422, "return_exceeds_order"
    )
    assert problem["errors"]["lines"][0]["returnable"] == 0


def test_receive_permissions_and_unknown(order, shopper_client, staff_client):
    return_id = ask_return(shopper_client, order, {"TEE-M": 1}).json()["id"]
    assert_problem(receive(shopper_client, return_id), 403, "permission_denied")
    assert_problem(receive(staff_client, "00000000-0000-0000-0000-000000000000"), 404, "not_found")
    assert_problem(receive(staff_client, "nope"), 404, "not_found")
    assert CompensationStep.objects.count() == 0
    assert ReturnRequest.objects.get(id=return_id).status == "requested"


def test_receive_starts_one_run_and_answers_202_again(order, shopper_client, staff_client):
    return_id = ask_return(shopper_client, order, {"TEE-M": 2}).json()["id"]
    first = receive(staff_client, return_id, key="r1")
    assert first.status_code == 202, first.content
    body = first.json()
    assert body["status"] == "processing"
    assert [s["name"] for s in body["steps"]] == [
        "restock",
        "refund",
        "history",
        "loyalty",
        "notify",
    ]
    assert {s["status"] for s in body["steps"]} == {"pending"}
    second = receive(staff_client, return_id, key="r2")  # another scanner, another key
    assert second.status_code == 202 and second.json()["status"] == "processing"
    assert CompensationStep.objects.filter(order_return_id=return_id).count() == 5
    assert OrderEvent.objects.filter(kind="return_received").count() == 1
    assert order.lines.get(sku="TEE-M").quantity_returned == 2
    # Received units are returned: nothing more of that line may be returned.
    assert_problem(
        ask_return(shopper_client, order, {"TEE-M": 1}, key="again"), 422, "return_exceeds_order"
    )


def _race(target, n=2):
    barrier = threading.Barrier(n, timeout=20)
    arrived = []
    results = [None] * n
    errors = []

    def park(_name):
        arrived.append(threading.get_ident())
        barrier.wait()

    def run(i):
        try:
            results[i] = target(i)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            from django.db import connection

            connection.close()

    with hook("returns.receive.before_decide", park):
        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert len(arrived) == n, "both callers were inside the receive at the same time"
    return results, errors


def test_concurrent_receives_start_one_run(order, shopper_client):
    return_id = ask_return(shopper_client, order, {"TEE-M": 1}).json()["id"]
    results, errors = _race(lambda i: return_receive(return_id=return_id).started)
    assert not errors, errors
    assert sorted(results) == [False, True]
    assert CompensationStep.objects.filter(order_return_id=return_id).count() == 5


def test_wrong_twin_check_then_update_starts_two_runs(order, shopper_client):
    return_id = ask_return(shopper_client, order, {"TEE-M": 1}).json()["id"]
    results, errors = _race(lambda i: return_receive_wrong_twin(return_id=return_id))
    assert not errors, errors
    assert results == [True, True]  # both "won": each would insert a set of steps


def test_two_returns_at_once_for_more_than_returnable(order, shopper, client_for):
    from django.db import connection

    barrier = threading.Barrier(2, timeout=20)
    answers = []

    def ask(i):
        try:
            barrier.wait()
            answers.append(
                ask_return(client_for(shopper), order, {"TEE-M": 2}, key=f"k{i}").status_code
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(answers) == [201, 422]
    assert ReturnRequest.objects.count() == 1
