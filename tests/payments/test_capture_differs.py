"""A capture whose amount at the provider differs from the one asked is no dead end.

The real simulator captures another amount than the one asked
(`capture_amount_delta`); the checkout answers `payment_pending`, the
settlement waits for staff with the provider's amount, and the admin's
"Needs attention" page offers the actions that end it (docs/payments.md,
"A captured amount that differs"): "Record what the provider captured" and,
when the provider took more, "Refund the difference". Each ends the item:
the order leaves `payment_pending`, its reservations leave `held`, the shop
agrees with the provider's ledger; a double click, a second tab and the
provider's late word change nothing twice. "Retry now", the only action
before, is the wrong twin: the next attempt flags the settlement again.
"""

from __future__ import annotations

import re
import threading
from decimal import Decimal

import pytest
from django.db import transaction
from django.test import Client

from inventory.models import Reservation
from orders.models import Order
from payments.capture_differs import (
    settlement_record_provider_capture,
    settlement_refund_difference,
)
from payments.models import Payment, PaymentEvent, PaymentSettlement, Refund
from payments.refunds import refund_run
from payments.settlement import payment_settle
from tests.backoffice.attention_support import VIEW_ALL, grant
from tests.concurrency import Workers, wait_for_lock_waiters
from tests.orders.conftest import ADDRESS
from tests.orders.money_model_support import deliver_webhook
from tests.payments.conftest import assert_reconciled

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = "/admin/needs-attention/"
ASKED = Decimal("20.00")  # 2 × 10.00


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def forms(page) -> list[dict]:
    """Every action form on the page: {kind, pk, action, idempotency_key}."""
    found = []
    for body in re.findall(r"<form method=\"post\".*?</form>", page.content.decode(), re.S):
        fields = dict(re.findall(r'name="(\w+)" value="([^"]*)"', body))
        fields.pop("csrfmiddlewaretoken", None)
        found.append(fields)
    return found


def settlement_forms(page) -> dict[str, dict]:
    return {f["action"]: f for f in forms(page) if f["kind"] == "settlement"}


@pytest.fixture
def boss(make_user):
    user = make_user(staff=True, username="boss")
    user.is_superuser = True
    user.save()
    return user


@pytest.fixture
def differing_order(provider, make_product, shopper_client):
    """Place an order (20.00) the provider captures as 20.00 + `delta`; it stays pending."""

    def place(delta: str) -> Order:
        make_product("TEE-M", price="10.00", stock=5)
        provider.faults(capture_amount_delta=delta)
        response = shopper_client.post(
            "/api/v1/orders/",
            {
                "lines": [{"sku": "TEE-M", "quantity": 2}],
                "payment_method": "pm_card_ok",
                "shipping_address": ADDRESS,
            },
            format="json",
            HTTP_IDEMPOTENCY_KEY=f"order-{delta}",
        )
        provider.faults(capture_amount_delta=None)
        assert response.status_code == 202, response.content
        order = Order.objects.select_related("payment").get(id=response.json()["id"])
        assert order.status == "payment_pending" and order.payment.status == "pending"
        settlement = PaymentSettlement.objects.get(transaction__payment=order.payment)
        assert settlement.needs_attention, "a differing capture waits for staff"
        return order

    return place


def held(order: Order) -> int:
    return Reservation.objects.filter(order_line__order=order, state="held").count()


def test_the_simulator_captures_another_amount_when_told(provider, differing_order):
    order = differing_order("1.50")
    (op,) = [o for o in provider.ledger() if o["kind"] == "capture"]
    assert Decimal(op["amount"]) == ASKED + Decimal("1.50")
    assert f"provider captured 21.50 EUR, shop asked {ASKED} EUR" in (
        PaymentSettlement.objects.get(transaction__payment=order.payment).last_error
    )


@pytest.mark.parametrize(
    ("delta", "offered"),
    [
        ("1.50", {"retry", "record", "refund_difference"}),
        ("-1.50", {"retry", "record"}),  # nothing to give back when it took less
    ],
)
def test_the_item_offers_the_actions_that_end_it(boss, differing_order, delta, offered):
    differing_order(delta)
    assert set(settlement_forms(login(boss).get(PAGE))) == offered


@pytest.mark.parametrize(("delta", "status"), [("1.50", "confirmed"), ("-1.50", "confirmed")])
def test_record_what_the_provider_captured_ends_it_once(boss, differing_order, delta, status):
    order = differing_order(delta)
    assert held(order) == 1
    client = login(boss)
    tab_1, tab_2 = client.get(PAGE), client.get(PAGE)
    form = settlement_forms(tab_1)["record"]
    assert form == settlement_forms(tab_2)["record"]  # the same state: the same key
    answers = [client.post(PAGE, form) for _ in range(3)]  # double click, second tab
    assert [a.status_code for a in answers] == [303] * 3
    assert [a.get("Idempotent-Replayed") for a in answers] == [None, "true", "true"]
    shown = client.get(answers[0]["Location"]).content.decode()
    assert "Record what the provider captured: done." in shown
    assert 'data-kind="settlement"' not in shown  # the item has ended

    captured = ASKED + Decimal(delta)
    payment = Payment.objects.get(id=order.payment.id)
    assert (payment.status, payment.amount_captured, payment.amount) == (
        "captured",
        captured,
        ASKED,
    )
    assert payment.capture_differs
    order.refresh_from_db()
    assert order.status == status
    assert held(order) == 0  # committed: nothing held for ever
    assert Reservation.objects.filter(order_line__order=order, state="committed").count() == 1
    assert (
        PaymentEvent.objects.filter(
            payment=payment, kind="transition", to_status="captured"
        ).count()
        == 1
    )
    assert not Refund.objects.filter(payment=payment).exists()
    assert_reconciled()


def test_refund_the_difference_ends_it_and_refunds_it_once(boss, differing_order):
    order = differing_order("1.50")
    client = login(boss)
    form = settlement_forms(client.get(PAGE))["refund_difference"]
    answers = [client.post(PAGE, form) for _ in range(2)]
    assert [a.get("Idempotent-Replayed") for a in answers] == [None, "true"]
    assert "Refund the difference: done." in client.get(answers[0]["Location"]).content.decode()
    order.refresh_from_db()
    assert order.status == "confirmed" and held(order) == 0
    (refund,) = Refund.objects.filter(payment=order.payment)
    assert (refund.amount, refund.origin, refund.status) == (
        Decimal("1.50"),
        "overcapture",
        "pending",
    )
    assert refund.provider_key.endswith(f":refund-{refund.id}:refund")  # derived, not random
    refund_run(refund_id=refund.id)
    refund.refresh_from_db()
    assert refund.status == "succeeded"
    payment = Payment.objects.get(id=order.payment.id)
    assert (payment.amount_captured, payment.amount_refunded) == (Decimal("21.50"), Decimal("1.50"))
    assert payment.amount_captured - payment.amount_refunded == ASKED
    assert payment.amount_refunded <= payment.refund_reserved <= payment.amount_captured
    assert_reconciled()


def test_two_decisions_from_two_tabs_decide_once(boss, differing_order):
    order = differing_order("1.50")
    client = login(boss)
    page = client.get(PAGE)
    record, refund = settlement_forms(page)["record"], settlement_forms(page)["refund_difference"]
    assert client.post(PAGE, refund).status_code == 303
    second = client.post(PAGE, record)  # the other tab: another key, the state decides
    assert "nothing changed" in client.get(second["Location"]).content.decode()
    assert Refund.objects.filter(payment=order.payment).count() == 1
    assert (
        PaymentEvent.objects.filter(
            payment=order.payment, kind="transition", to_status="captured"
        ).count()
        == 1
    )


def test_the_providers_late_word_after_the_decision_changes_nothing(
    boss, provider, differing_order
):
    order = differing_order("-1.50")
    client = login(boss)
    client.post(PAGE, settlement_forms(client.get(PAGE))["record"])
    before = Payment.objects.values().get(id=order.payment.id)
    settlement = PaymentSettlement.objects.get(transaction__payment=order.payment)
    assert settlement.done_at is not None and not settlement.needs_attention
    payment_settle(settlement_id=settlement.id)  # a stale attempt: nothing due
    for event in provider.webhook_events():
        assert deliver_webhook(event) == 200
    assert Payment.objects.values().get(id=order.payment.id) == before
    assert not PaymentSettlement.objects.get(id=settlement.id).needs_attention
    assert_reconciled()


def test_retry_now_alone_never_ends_it(boss, differing_order):
    """The wrong twin: the one action offered before; the next attempt flags it again."""
    order = differing_order("1.50")
    client = login(boss)
    client.post(PAGE, settlement_forms(client.get(PAGE))["retry"])
    settlement = PaymentSettlement.objects.get(transaction__payment=order.payment)
    payment_settle(settlement_id=settlement.id)
    settlement.refresh_from_db()
    assert settlement.needs_attention and settlement.done_at is None
    order.refresh_from_db()
    assert order.status == "payment_pending" and held(order) == 1
    assert {"record", "refund_difference"} <= set(settlement_forms(client.get(PAGE)))


@pytest.mark.parametrize(
    ("action", "permissions"),
    [
        ("record", ("payments.change_paymentsettlement",)),
        ("refund_difference", ("payments.change_paymentsettlement", "orders.refund_order")),
    ],
)
def test_each_action_needs_its_permissions(make_user, boss, differing_order, action, permissions):
    order = differing_order("1.50")
    form = settlement_forms(login(boss).get(PAGE))[action]
    viewer = make_user(staff=True, username="viewer")
    grant(viewer, *VIEW_ALL, *permissions[:-1])
    assert login(viewer).post(PAGE, form).status_code == 403
    assert Payment.objects.get(id=order.payment.id).status == "pending"
    clerk = make_user(staff=True, username="clerk")
    grant(clerk, *VIEW_ALL, *permissions)
    answer = login(clerk).post(PAGE, form)
    assert answer.status_code == 303
    assert Payment.objects.get(id=order.payment.id).status == "captured"


def test_decisions_racing_each_other_decide_once(differing_order):
    """Four staff decisions at the same moment (two of each): all wait on the payment's lock
    (overlap observed in PostgreSQL), one decides, the others change nothing."""
    order = differing_order("1.50")
    settlement = PaymentSettlement.objects.get(transaction__payment=order.payment)
    locked, release = threading.Event(), threading.Event()

    def holder():
        with transaction.atomic():
            Payment.objects.select_for_update().get(id=order.payment.id)
            locked.set()
            release.wait(60)
        return None

    workers = Workers()
    workers.start(holder)
    assert locked.wait(30)
    decisions = [settlement_record_provider_capture, settlement_refund_difference] * 2
    for decide in decisions:
        workers.start(decide, settlement_id=settlement.id)
    wait_for_lock_waiters(len(decisions))
    release.set()
    results = [r for r in workers.join() if r is not None]
    assert sorted(results) == [False, False, False, True]
    payment = Payment.objects.get(id=order.payment.id)
    assert payment.status == "captured" and payment.amount_captured == ASKED + Decimal("1.50")
    moves = PaymentEvent.objects.filter(payment=payment, kind="transition", to_status="captured")
    assert moves.count() == 1
    assert Refund.objects.filter(payment=payment).count() <= 1
    assert payment.refund_reserved == sum(r.amount for r in Refund.objects.filter(payment=payment))
    order.refresh_from_db()
    assert order.status == "confirmed" and held(order) == 0
