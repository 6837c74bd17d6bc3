"""The chaos run's checker: a correct state passes, each kind of wrong state fails its invariant.

One small correct state is built through the real services (the API, a real
simulator process, the relay and the consumer tasks run here): a paid
checkout and its replay, an order confirmed after the shopper's decision and
then cancelled (compensation driven here), a staff refund, an order left
awaiting its decision, the events consumed. `verify` finds nothing wrong
with it; then each corruption, made inside a savepoint (and on a copy of the
run folder) and rolled back, must be reported by exactly the invariant that
names it. Built once for all corruptions: the suite is slow enough.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.db.models import F
from django.db.models.functions import Now

from idempotency.messaging import relay
from idempotency.messaging.outbox import outbox_write
from idempotency.models import InboxMessage, OutboxMessage
from inventory.models import Reservation, StockItem
from orders.models import CompensationStep, Order, OrderLine, ReturnRequest
from payments.models import Payment, PaymentSettlement, PaymentTransaction, Refund
from payments.refunds import refund_run
from shop.models import LoyaltyAccount, Mail, PurchaseHistoryLine
from shop.tasks import consume_history, consume_loyalty
from tests.orders.compensation_support import drive
from tests.orders.conftest import ADDRESS
from tests.orders.shipping import ship
from tests.support.servers import database_url_for_current_connection
from tests.support.simulator import ROOT, Simulator
from tools.chaos import check, invariants
from tools.chaos.invariants import RunFiles, verify

# The checkout calls the provider with no transaction open: real transactions here.
pytestmark = pytest.mark.django_db(transaction=True)

TASKS = {"shop.consume_loyalty": consume_loyalty, "shop.consume_history": consume_history}


@dataclass
class State:
    run_dir: Path
    install: str
    orders: dict[str, Order] = field(default_factory=dict)
    answers: list[dict] = field(default_factory=list)
    returned: ReturnRequest | None = None


@pytest.fixture
def broker(monkeypatch, settings):
    """A queue (and unacked hash) of this test's own on the test Redis: nothing else reads it."""
    import redis

    name = f"chaos-check-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(invariants, "_queues", lambda: [name])
    monkeypatch.setattr(invariants, "UNACKED_KEY", f"{name}-unacked")
    monkeypatch.setattr(invariants, "BROKER_REREAD", 0.05)
    settings.CELERY_BROKER_URL = settings.REDIS_URL
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client, name
    client.delete(name, f"{name}-unacked")
    client.close()


def _call(state: State, client, *, kind: str, method: str, path: str, key: str, body=None):
    response = getattr(client, method.lower())(path, body, format="json", HTTP_IDEMPOTENCY_KEY=key)
    state.answers.append(
        {
            "t": float(len(state.answers)),
            "host": "a",
            "actor": client.user.username,
            "kind": kind,
            "method": method,
            "path": path,
            "key": key,
            "status": response.status_code,
            "replayed": response.headers.get("Idempotent-Replayed") == "true",
            "body": response.json() if response.content else None,
        }
    )
    return response


def _checkout(state, client, lines: dict[str, int], key: str, on_shortage: str = "reject"):
    return _call(
        state,
        client,
        kind="checkout",
        method="POST",
        path="/api/v1/orders/",
        key=key,
        body={
            "lines": [{"sku": sku, "quantity": q} for sku, q in lines.items()],
            "on_shortage": on_shortage,
            "payment_method": "pm_card_ok",
            "shipping_address": ADDRESS,
        },
    )


def _consume_events(monkeypatch) -> int:
    """Play the relay and the workers here: publish every outbox message, run its consumers."""
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(relay, "publish", lambda pairs: sent.extend(pairs))
    while relay.relay_once():
        pass
    for name, message_id in sent:
        TASKS[name](message_id)
    return len(sent)


@pytest.fixture
def state(
    request, tmp_path, settings, monkeypatch, make_product, shopper_client, staff_client, broker
):
    """The correct state; `indirect` param "subprocess": take the snapshot the driver's way."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    simulator = Simulator(tmp_path)
    simulator.db_path = run_dir / "provider.sqlite3"  # where the driver's simulator keeps it
    simulator.start()
    settings.PAYMENTS_PROVIDER_URL = simulator.url
    settings.PAYMENTS_PROVIDER_TIMEOUT = 5.0
    try:
        make_product("TEE", price="10.00", stock=10)
        make_product("MUG", price="7.50", stock=3)
        make_product("CAP", price="4.00", stock=1)
        if getattr(request, "param", None) == "subprocess":
            # The driver's way: `python -m tools.chaos.check` on the same database.
            subprocess.run(
                [sys.executable, "-m", "tools.chaos.check", "snapshot", "--run-dir", str(run_dir)],
                env={**os.environ, "DATABASE_URL": database_url_for_current_connection()},
                cwd=ROOT,
                check=True,
                timeout=60,
            )
        else:
            assert check.main(["snapshot", "--run-dir", str(run_dir)]) == 0
        built = State(run_dir=run_dir, install="")

        paid = _checkout(built, shopper_client, {"TEE": 2}, "k-paid")
        assert paid.status_code == 201, paid.content
        replay = _checkout(built, shopper_client, {"TEE": 2}, "k-paid")
        assert replay.headers["Idempotent-Replayed"] == "true"
        built.orders["paid"] = Order.objects.get(id=paid.json()["id"])

        asked = _checkout(built, shopper_client, {"MUG": 4}, "k-ask", on_shortage="ask")
        assert asked.json()["status"] == "awaiting_decision", asked.content
        order_id = asked.json()["id"]
        confirmed = _call(
            built,
            shopper_client,
            kind="confirm",
            method="POST",
            path=f"/api/v1/orders/{order_id}/confirm/",
            key="c-ask",
        )
        assert confirmed.json()["status"] == "partially_confirmed", confirmed.content

        waiting = _checkout(built, shopper_client, {"CAP": 2}, "k-wait", on_shortage="ask")
        assert waiting.json()["status"] == "awaiting_decision", waiting.content
        built.orders["waiting"] = Order.objects.get(id=waiting.json()["id"])

        refund = _call(
            built,
            staff_client,
            kind="refund",
            method="POST",
            path=f"/api/v1/orders/{paid.json()['id']}/refunds/",
            key="r-paid",
            body={"amount": "5.00", "currency": "EUR", "reason": "goodwill"},
        )
        assert refund.status_code == 201, refund.content
        refund_run(refund_id=refund.json()["id"])

        # After the 5.00 goodwill, a return of both tees (20.00) is capped at 15.00.
        ship(built.orders["paid"])
        asked_return = _call(
            built,
            shopper_client,
            kind="return_request",
            method="POST",
            path=f"/api/v1/orders/{paid.json()['id']}/returns/",
            key="ret-paid",
            body={"lines": [{"sku": "TEE", "quantity": 2}], "reason": "chaos"},
        )
        assert asked_return.status_code == 201, asked_return.content
        return_id = asked_return.json()["id"]
        received = _call(
            built,
            staff_client,
            kind="return_receive",
            method="POST",
            path=f"/api/v1/returns/{return_id}/receive/",
            key="rcv-paid",
        )
        assert received.status_code in (200, 202), received.content
        drive(order_return_id=return_id)
        built.returned = ReturnRequest.objects.get(id=return_id)
        assert (built.returned.status, built.returned.refund_amount) == (
            "completed",
            Decimal("15.00"),
        )

        cancel = _call(
            built,
            shopper_client,
            kind="cancel",
            method="POST",
            path=f"/api/v1/orders/{order_id}/cancel/",
            key="x-ask",
        )
        assert cancel.status_code == 202, cancel.content
        drive(order_id=order_id)
        built.orders["cancelled"] = Order.objects.get(id=order_id)
        assert built.orders["cancelled"].status == "cancelled"

        assert _consume_events(monkeypatch) == 8  # 4 events × 2 consumers
        (run_dir / "answers.jsonl").write_text("".join(json.dumps(a) + "\n" for a in built.answers))
        built.install = invariants.install_id() or ""
        yield built
    finally:
        simulator.stop()


def _failing(results) -> dict[str, list[str]]:
    return {r.name: r.violations for r in results if r.violations}


@pytest.mark.parametrize("state", ["subprocess"], indirect=True)
def test_a_correct_state_has_no_violation_and_wait_returns_0(state, monkeypatch, capsys):
    initial = json.loads((state.run_dir / "initial.json").read_text())
    assert initial["stock"]["TEE"] == {"on_hand": 10, "reserved": 0, "committed": 0, "restocked": 0}
    results = verify(files=RunFiles(state.run_dir))
    assert _failing(results) == {}, json.dumps(_failing(results), indent=1)
    checked = {r.name: r.checked for r in results}
    # Every invariant looked at something (nothing passes by checking nothing)...
    assert all(checked[name] > 0 for name in checked if name != "broker_empty"), checked
    # ...and the CLI agrees: table on stdout, invariants.json, exit 0.
    assert check.main(["verify", "--run-dir", str(state.run_dir)]) == 0
    out = capsys.readouterr().out
    assert "OK: 0 violations" in out and "stock_balance" in out
    written = json.loads((state.run_dir / "invariants.json").read_text())
    assert written["ok"] is True
    assert {i["name"] for i in written["invariants"]} == set(checked)
    # Quiet: wait returns at once.
    monkeypatch.setattr(check, "POLL_EVERY", 0.05)
    assert check.main(["wait", "--run-dir", str(state.run_dir), "--timeout", "5"]) == 0
    assert "quiet after" in capsys.readouterr().err
    # The chaos run's wait also waits for the order left awaiting its decision:
    # its expiry will write an event, after a wait that ignored it.
    awaiting = Order.objects.get(status="awaiting_decision")
    args = ["wait", "--run-dir", str(state.run_dir), "--timeout", "0.3", "--through-holds"]
    assert check.main(args) == 3
    assert f"awaiting_decision: order {awaiting.number} (expires in" in capsys.readouterr().out


# -- the corruptions: each made on a copy of the run folder, inside a savepoint ----------------


def _ledger(run_dir: Path) -> sqlite3.Connection:
    return sqlite3.connect(run_dir / "provider.sqlite3", isolation_level=None)


def _second_order_same_key(state: State, run_dir: Path) -> None:
    # What a retry running phase 1 twice leaves: an order no request key names.
    first = state.orders["paid"]
    Order.objects.create(
        owner_id=first.owner_id,
        status="payment_failed",
        on_shortage=first.on_shortage,
        payment_method=first.payment_method,
        shipping_address=first.shipping_address,
        currency=first.currency,
        total=first.total,
    )


def _second_charge_one_key(state: State, run_dir: Path) -> None:
    # A provider that charged twice under one key: the ledger's UNIQUE(key) gone. The
    # shop's reconciliation keys the ledger by key, so only the direct count sees it.
    ledger = _ledger(run_dir)
    ledger.executescript(
        "CREATE TABLE copy AS SELECT * FROM operations; DROP TABLE operations; "
        "ALTER TABLE copy RENAME TO operations;"
    )
    key = f"{state.install}:order-{state.orders['paid'].number}:capture"
    ledger.execute(
        "INSERT INTO operations (seq, id, key, kind, fingerprint, status, amount, currency, "
        "payment_method, reference, parent_key, decline_code, created_at) "
        "SELECT seq + 1000, id || '-again', key, kind, fingerprint, status, amount, currency, "
        "payment_method, reference, parent_key, decline_code, created_at FROM operations "
        "WHERE key = ?",
        (key,),
    )
    ledger.close()


def _refunded_more_than_captured(state: State, run_dir: Path) -> None:
    # Consistent on both sides (so reconciliation agrees): 20.00 captured, 40.00 refunded.
    payment = Payment.objects.get(order=state.orders["paid"])
    refund = Refund.objects.get(payment=payment, origin="goodwill")
    with connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE payments_payment "
            "DROP CONSTRAINT payments_payment_refunded_le_reserved_le_captured, "
            "DROP CONSTRAINT payments_payment_refunded_le_captured"
        )
    more = Decimal("25.00") - refund.amount  # the return's 15.00 stays beside it
    Payment.objects.filter(id=payment.id).update(
        amount_refunded=F("amount_refunded") + more, refund_reserved=F("refund_reserved") + more
    )
    Refund.objects.filter(id=refund.id).update(amount=Decimal("25.00"))
    PaymentTransaction.objects.filter(id=refund.transaction_id).update(amount=Decimal("25.00"))
    ledger = _ledger(run_dir)
    ledger.execute("UPDATE operations SET amount = '25.00' WHERE key = ?", (refund.provider_key,))
    ledger.close()


def _cancelled_not_refunded_in_full(state: State, run_dir: Path) -> None:
    # Finding 2's outcome: the cancellation refunded less than was captured, and the shop
    # and the provider agree on it (so reconciliation is clean): 22.50 captured, 20.00 back.
    payment = Payment.objects.get(order=state.orders["cancelled"])
    refund = Refund.objects.get(payment=payment)
    Payment.objects.filter(id=payment.id).update(
        amount_refunded=Decimal("20.00"), refund_reserved=Decimal("20.00")
    )
    Refund.objects.filter(id=refund.id).update(amount=Decimal("20.00"))
    PaymentTransaction.objects.filter(id=refund.transaction_id).update(amount=Decimal("20.00"))
    ledger = _ledger(run_dir)
    ledger.execute("UPDATE operations SET amount = '20.00' WHERE key = ?", (refund.provider_key,))
    ledger.close()


def _return_says_its_value(state: State, run_dir: Path) -> None:
    # The return's body says its lines' value (20.00), not the capped 15.00 it refunded.
    assert state.returned is not None
    ReturnRequest.objects.filter(id=state.returned.id).update(refund_amount=Decimal("20.00"))


def _return_over_its_value(state: State, run_dir: Path) -> None:
    # A refund_amount over its lines' value (20.00): it cannot be a refund either (the
    # payment's CHECK keeps refunded ≤ captured = 20.00), so both of its checks report it.
    assert state.returned is not None
    ReturnRequest.objects.filter(id=state.returned.id).update(refund_amount=Decimal("20.01"))


def _refund_left_flagged(state: State, run_dir: Path) -> None:
    # A decided refund flagged again (the provider's late word) that nobody resolved.
    Refund.objects.filter(payment__order=state.orders["paid"], origin="goodwill").update(
        needs_attention=True, last_error="the provider reports a refund that was recorded ..."
    )


def _cancellation_held_by_a_refund(state: State, run_dir: Path) -> None:
    # A cancellation's refund step waiting while a refund of the order needs staff: parked
    # (not pending work: it waits for their decision), and the refund is left for staff.
    order = state.orders["cancelled"]
    CompensationStep.objects.filter(order=order, kind="cancellation", name="refund").update(
        done_at=None, status="pending", next_attempt_at=F("updated_at")
    )
    Refund.objects.filter(payment__order=order).update(
        needs_attention=True, last_error="the provider reports a refund that was recorded ..."
    )


def _refund_missing_at_provider(state: State, run_dir: Path) -> None:
    refund = Refund.objects.get(payment__order=state.orders["paid"], origin="goodwill")
    ledger = _ledger(run_dir)
    ledger.execute("DELETE FROM operations WHERE key = ?", (refund.provider_key,))
    ledger.close()


def _captured_not_confirmed_total(state: State, run_dir: Path) -> None:
    # The line's price moved after the capture: 2 × 11.00 confirmed, 20.00 captured.
    OrderLine.objects.filter(order=state.orders["paid"]).update(unit_price=Decimal("11.00"))


def _on_hand_off_by_one(state: State, run_dir: Path) -> None:
    StockItem.objects.filter(product__sku="TEE").update(on_hand=F("on_hand") + 1)


def _reserved_not_held(state: State, run_dir: Path) -> None:
    StockItem.objects.filter(product__sku="TEE").update(reserved=F("reserved") + 1)


def _held_past_expiry(state: State, run_dir: Path) -> None:
    # The expiry sweeper never ran: the awaiting order's flag is held past its expiry.
    line = OrderLine.objects.get(order=state.orders["waiting"])
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE inventory_reservation SET expires_at = now() - interval '1 minute' "
            "WHERE id = %s",
            [line.reservation_id],
        )
    assert Reservation.objects.get(order_line=line).state == "held"


def _inbox_row_missing(state: State, run_dir: Path) -> None:
    InboxMessage.objects.filter(consumer="purchase_history").order_by("id")[:1].get().delete()


def _effect_applied_twice(state: State, run_dir: Path) -> None:
    account = LoyaltyAccount.objects.get(user_id=state.orders["paid"].owner_id)
    LoyaltyAccount.objects.filter(user_id=account.user_id).update(
        applied=[*account.applied, account.applied[0]]
    )


def _mail_without_its_delivery(state: State, run_dir: Path) -> None:
    # Sent (done: not pending work), but no e-mails delivery of its event was ever applied.
    Mail.objects.create(
        message_id=str(uuid.uuid4()),
        event_type="order.confirmed",
        payload={},
        address="someone@example.com",
        done_at=Now(),
    )


def _loyalty_not_sum(state: State, run_dir: Path) -> None:
    LoyaltyAccount.objects.filter(user_id=state.orders["paid"].owner_id).update(
        balance=F("balance") + 1
    )


def _history_not_orders(state: State, run_dir: Path) -> None:
    PurchaseHistoryLine.objects.filter(order_id=str(state.orders["paid"].id)).update(
        quantity=F("quantity") + 1
    )


def _replay_differs(state: State, run_dir: Path) -> None:
    first = next(a for a in state.answers if a["key"] == "k-paid")
    replay = {**first, "t": 99.0, "replayed": True, "body": {**first["body"], "total": "0.00"}}
    with (run_dir / "answers.jsonl").open("a") as answers:
        answers.write(json.dumps(replay) + "\n")


def _left_in_broker(state: State, run_dir: Path, broker) -> None:
    client, queue = broker
    message = {"headers": {"task": "payments.refund", "id": str(uuid.uuid4())}, "body": ""}
    client.lpush(queue, json.dumps(message))


def _flagged_without_reason(state: State, run_dir: Path) -> None:
    settlement = PaymentSettlement.objects.order_by("id")[:1].get()
    PaymentSettlement.objects.filter(pk=settlement.pk).update(
        done_at=None, needs_attention=True, last_error=""
    )


def _at_budget_not_flagged(state: State, run_dir: Path) -> None:
    budget = OutboxMessage.due_policy().max_attempts
    OutboxMessage.objects.filter(pk=OutboxMessage.objects.order_by("id")[:1].get().pk).update(
        done_at=None, attempts=budget
    )


def _left_pending(state: State, run_dir: Path) -> None:
    Refund.objects.filter(payment__order=state.orders["paid"]).update(done_at=None)


# (what, how, the invariants that must report it: "+"-joined when two must)
CORRUPTIONS: list[tuple[str, Callable, str]] = [
    ("a second order with the same key", _second_order_same_key, "orders_per_key"),
    ("a replay body differs from the final one", _replay_differs, "replays_equal_final"),
    ("a second provider charge for one capture key", _second_charge_one_key, "provider_charges"),
    ("captured ≠ confirmed total", _captured_not_confirmed_total, "captured_equals_confirmed"),
    ("refunded > captured", _refunded_more_than_captured, "refunded_le_captured"),
    ("a refund missing at the provider", _refund_missing_at_provider, "reconciliation_clean"),
    ("stock on hand off by one", _on_hand_off_by_one, "stock_balance"),
    ("reserved ≠ held flags", _reserved_not_held, "stock_reserved_non_negative"),
    ("a held reservation past expiry", _held_past_expiry, "no_held_reservation_past_expiry"),
    ("an inbox row missing", _inbox_row_missing, "events_applied_once"),
    ("an effect applied twice", _effect_applied_twice, "events_applied_once"),
    ("a mail row without its delivery", _mail_without_its_delivery, "events_applied_once"),
    ("loyalty ≠ sum of the events", _loyalty_not_sum, "loyalty_equals_events"),
    ("history ≠ confirmed − returned − cancelled", _history_not_orders, "history_equals_orders"),
    (
        "cancelled, refunded less than captured",
        _cancelled_not_refunded_in_full,
        "cancelled_refunded_in_full",
    ),
    (
        "a return's refund_amount is its value, not its refund",
        _return_says_its_value,
        "return_refund_within_value",
    ),
    ("a return refunded over its value", _return_over_its_value, "return_refund_within_value"),
    ("a refund left needing attention", _refund_left_flagged, "nothing_needs_attention"),
    (
        "a cancellation held by a refund that needs staff",
        _cancellation_held_by_a_refund,
        "nothing_needs_attention",
    ),
    # Flagged: it waits for a person, as well.
    (
        "a dead letter without a reason",
        _flagged_without_reason,
        "due_work_budget+nothing_needs_attention",
    ),
    ("work left pending", _left_pending, "nothing_pending"),
    # Looping: at its budget yet still due, so it is pending work as well.
    ("a row at its budget not flagged", _at_budget_not_flagged, "due_work_budget+nothing_pending"),
    ("a message left in the broker queue", _left_in_broker, "broker_empty"),
]


def test_each_corruption_is_reported_by_exactly_its_invariant(state, broker, tmp_path):
    """One state, every corruption in turn (rolled back): faster than one state each."""
    wrong: list[str] = []
    for number, (what, corrupt, expected) in enumerate(CORRUPTIONS):
        run_dir = tmp_path / f"corrupt-{number}"
        shutil.copytree(state.run_dir, run_dir)
        with transaction.atomic():
            if corrupt is _left_in_broker:
                corrupt(state, run_dir, broker)
            else:
                corrupt(state, run_dir)
            failing = _failing(verify(files=RunFiles(run_dir)))
            transaction.set_rollback(True)
        client, queue = broker
        client.delete(queue)
        if set(failing) != set(expected.split("+")):
            wrong.append(f"{what}: expected only {expected}, got {failing}")
    assert wrong == []
    # Rolled back: the state is correct again.
    assert _failing(verify(files=RunFiles(state.run_dir))) == {}


# -- wait -----------------------------------------------------------------------------------


def test_wait_returns_3_on_timeout_and_prints_what_is_pending(
    broker, monkeypatch, capsys, tmp_path
):
    monkeypatch.setattr(check, "POLL_EVERY", 0.05)
    with transaction.atomic():
        message = outbox_write(
            aggregate_type="order", aggregate_id="x", event_type="order.confirmed", payload={}
        )
    client, queue = broker
    client.lpush(queue, json.dumps({"headers": {"task": "orders.compensation_step", "id": "t1"}}))
    # An expiring beat tick is expendable: it alone would not keep wait from returning.
    client.lpush(
        queue,
        json.dumps({"headers": {"task": "payments.sweep_refunds", "id": "t2", "expires": "x"}}),
    )
    assert check.main(["wait", "--run-dir", str(tmp_path), "--timeout", "0.3"]) == 3
    captured = capsys.readouterr()
    assert "pending:" in captured.err and "timed out" in captured.err
    assert f"OutboxMessage: {message.pk}" in captured.out
    assert "broker: " in captured.out and "orders.compensation_step t1" in captured.out
    assert "t2" not in captured.out
