"""Cancelling a confirmed, unshipped order: 202 `cancelling`, compensation, then `cancelled`.

Twice, from two clients at once, racing a shipment (both take the order's
row lock: exactly one wins), and with the worker killed mid-way: one refund,
the units back once, one `order.cancelled` outbox row.
"""

from __future__ import annotations

import threading

import pytest
from celery import current_app
from django.db import connection

from core.errors import ApplicationError
from idempotency.failpoints import hits
from idempotency.models import OutboxMessage
from inventory.models import StockItem
from orders.compensation import cancellation_refund_id
from orders.models import CompensationStep, Order, Shipment
from orders.services import order_cancel
from orders.tasks import sweep_compensation
from payments.models import Refund
from payments.tasks import sweep_refunds
from tests.conftest import assert_problem
from tests.orders.compensation_support import drive, paid_order
from tests.orders.shipping import ship
from tests.payments.refund_support import provider_refunds
from tests.support.servers import wait_until
from tests.support.simulator import assert_reconciled

pytestmark = pytest.mark.django_db(transaction=True)

CANCEL = "/api/v1/orders/{}/cancel/"


@pytest.fixture
def quiet_bells(monkeypatch, settings):
    settings.COMPENSATION_WAIT_SECONDS = 0.01
    monkeypatch.setattr(current_app, "send_task", lambda *a, **kw: None)


@pytest.fixture
def order(provider, make_product, shopper_client):
    make_product("TEE-M", price="10.00", stock=10)
    make_product("CAP", price="5.50", stock=10)
    return paid_order(shopper_client, {"TEE-M": 2, "CAP": 1})


def cancel(client, order, key="c1"):
    return client.post(CANCEL.format(order.id), format="json", HTTP_IDEMPOTENCY_KEY=key)


def assert_cancelled_once(order, provider) -> None:
    order.refresh_from_db()
    assert order.status == "cancelled"
    assert StockItem.objects.get(product__sku="TEE-M").on_hand == 10
    assert StockItem.objects.get(product__sku="CAP").on_hand == 10
    assert set(order.lines.values_list("status", flat=True)) == {"cancelled"}
    refunds = provider_refunds(provider)
    assert len(refunds) == 1 and refunds[0]["amount"] == "25.50"
    assert Refund.objects.get().id == cancellation_refund_id(order.id)
    assert OutboxMessage.objects.filter(event_type="order.cancelled").count() == 1
    assert CompensationStep.objects.filter(order=order).count() == 5
    assert order.events.filter(kind="cancelled", line__isnull=True).count() == 1
    assert_reconciled()


def test_cancel_compensates_then_cancelled_and_twice_is_200(
    order, provider, shopper_client, quiet_bells
):
    first = cancel(shopper_client, order)
    assert first.status_code == 202, first.content
    assert first.json()["status"] == "cancelling"
    replay = cancel(shopper_client, order)
    assert replay.status_code == 202 and replay["Idempotent-Replayed"] == "true"
    again = cancel(shopper_client, order, key="c2")
    assert again.status_code == 200 and again.json()["status"] == "cancelling"
    drive(order=order, kind="cancellation")
    assert_cancelled_once(order, provider)
    body = cancel(shopper_client, order, key="c3")
    assert body.status_code == 200 and body.json()["status"] == "cancelled"
    assert body.json()["payment"]["status"] == "refunded"


def test_cancel_from_two_clients_at_once_starts_once(
    order, provider, shopper, client_for, quiet_bells
):
    barrier = threading.Barrier(2, timeout=20)
    answers = []

    def go(i):
        try:
            client = client_for(shopper)
            barrier.wait()
            answers.append(cancel(client, order, key=f"k{i}").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(answers) == [200, 202]
    assert CompensationStep.objects.filter(order=order).count() == 5
    drive(order=order, kind="cancellation")
    assert_cancelled_once(order, provider)


def test_cancel_racing_a_shipment_one_wins(order, provider, quiet_bells):
    barrier = threading.Barrier(2, timeout=20)
    outcome = {}

    def run(name, call):
        try:
            barrier.wait()
            call()
            outcome[name] = "won"
        except ApplicationError as exc:
            outcome[name] = exc.code
        finally:
            connection.close()

    threads = [
        threading.Thread(target=run, args=("cancel", lambda: order_cancel(order_id=order.id))),
        threading.Thread(target=run, args=("ship", lambda: ship(order))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    order.refresh_from_db()
    if outcome["cancel"] == "won":
        assert outcome["ship"] == "invalid_state" and not Shipment.objects.exists()
        assert order.status == "cancelling"
    else:
        assert outcome == {"ship": "won", "cancel": "order_shipped"}
        assert not CompensationStep.objects.exists() and order.status == "confirmed"


def test_cancel_refusals(provider, make_product, shopper_client, quiet_bells):
    make_product("TEE-M", price="10.00", stock=10)
    shipped = paid_order(shopper_client, {"TEE-M": 2}, key="o1")
    ship(shipped, {"TEE-M": 1})
    assert_problem(cancel(shopper_client, shipped), 409, "order_shipped")
    pending = paid_order(shopper_client, {"TEE-M": 1}, key="o2")
    Order.objects.filter(id=pending.id).update(status="payment_pending")
    assert_problem(cancel(shopper_client, pending, key="c2"), 409, "payment_pending")
    assert not CompensationStep.objects.exists()


@pytest.mark.slow
def test_cancel_with_the_worker_killed_mid_way(
    order, provider, shopper_client, celery_worker_process, tmp_path
):
    celery_worker_process(
        failpoints="compensation.refund.after_effect=exit@1,compensation.restock.after_effect=exit@1",
        PAYMENTS_PROVIDER_URL=provider.url,
        PAYMENTS_PROVIDER_TIMEOUT="2",
        PAYMENTS_REFUND_BACKOFF_BASE="0.3",
        COMPENSATION_BACKOFF_BASE="0.3",
        COMPENSATION_BACKOFF_MAX="1",
        COMPENSATION_WAIT_SECONDS="0.3",
        # A killed attempt's step is due again when its attempt lease runs out: this
        # step's worst case (a 2 s provider call), not the hard time limit.
        COMPENSATION_ATTEMPT_LEASE="8",
    )
    assert cancel(shopper_client, order).status_code == 202

    def cancelled():
        if Order.objects.get(id=order.id).status == "cancelled":
            return True
        sweep_compensation.apply()
        sweep_refunds.apply()
        return False

    wait_until(cancelled, timeout=90, interval=0.5, message="the order is cancelled")
    folder = str(tmp_path / "failpoints")
    assert hits("compensation.refund.after_effect", folder) == 1
    assert hits("compensation.restock.after_effect", folder) == 1
    assert_cancelled_once(order, provider)
