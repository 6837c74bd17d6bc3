"""The provider's webhooks (issue 11): signed, stored once in the inbox, applied once.

Real simulator process, real PostgreSQL; the live-delivery tests run a real
gunicorn (or a stub receiver that verifies every signature). Every scenario
that moved money ends with the independent reconciliation.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from django.conf import settings
from django.db import connection, transaction
from django.test import Client

from core.api_tokens import api_token_issue
from idempotency import metrics
from idempotency.models import InboxMessage
from orders.models import Order, OrderEvent
from payments import webhooks
from payments.capture import payment_capture, payment_create
from payments.gateway.simulator import SimulatorGateway
from payments.keys import install_id, provider_key
from payments.lock_objects import payment_lock
from payments.models import PaymentEvent, PaymentSettlement, PaymentStatus
from tests.concurrency import Workers, wait_for_lock_waiters, wait_until
from tests.orders.conftest import ADDRESS
from tests.support.simulator import Simulator, assert_reconciled, settle_due

URL = "/api/v1/payments/webhooks/"

transactional = pytest.mark.django_db(transaction=True)


# -- helpers -----------------------------------------------------------------------


def make_payment(method="pm_card_timeout", reference=None, amount="42.00"):
    return payment_create(
        reference=reference or f"order-{uuid.uuid4().hex[:8]}",
        amount=Decimal(amount),
        currency="EUR",
        payment_method=method,
    )


def pending_capture(provider, reference=None):
    """A `pm_card_timeout` capture: charged at the provider, answer lost, payment `pending`."""
    payment = make_payment("pm_card_timeout", reference=reference)
    assert payment_capture(payment_id=payment.id).outcome == "unknown"
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.PENDING
    key = payment.transactions.get(kind="capture").provider_key
    (op,) = provider.charges(key)
    return payment, op


def event_for(op: dict, event_type="charge.captured", **data) -> dict:
    return {
        "id": f"evt_{uuid.uuid4().hex}",
        "type": event_type,
        "created": int(time.time()),
        "data": {
            "provider_key": op["key"],
            "reference": op["reference"],
            "amount": op["amount"],
            "currency": op["currency"],
            "operation_id": op.get("id", ""),
            **data,
        },
    }


def post(event=None, *, body: bytes | None = None, t: int | None = None, signed_body=None,
         secret=None, header: str | None = "sign", client=None):  # fmt: skip
    body = body if body is not None else json.dumps(event).encode()
    headers = {}
    if header == "sign":
        value = webhooks.sign(
            secret=secret or settings.PAYMENTS_WEBHOOK_SECRET,
            timestamp=int(time.time()) if t is None else t,
            body=signed_body if signed_body is not None else body,
        )
        headers["HTTP_SHOP_SIGNATURE"] = value
    elif header is not None:
        headers["HTTP_SHOP_SIGNATURE"] = header
    return (client or Client()).post(URL, data=body, content_type="application/json", **headers)


def duplicates() -> int:
    return metrics.duplicate_totals()[metrics.WEBHOOK_DUPLICATE]


def transitions(payment, to_status) -> int:
    return PaymentEvent.objects.filter(
        payment_id=payment.id, kind="transition", to_status=to_status
    ).count()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- the signature and bad input: 400, nothing stored ------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "case",
    ["forged", "stale", "future", "other_body", "missing_header", "no_v1", "garbage_header"],
)
def test_bad_signatures_are_rejected_and_nothing_is_stored(case):
    event = event_for({"key": "k", "reference": "order-x", "amount": "1.00", "currency": "EUR"})
    body = json.dumps(event).encode()
    kwargs = {
        "forged": {"secret": "not-the-secret"},
        "stale": {"t": int(time.time()) - 301},
        "future": {"t": int(time.time()) + 301},
        "other_body": {"signed_body": body.replace(b"1.00", b"0.01")},
        "missing_header": {"header": None},
        "no_v1": {"header": f"t={int(time.time())}"},
        "garbage_header": {"header": "t=abc,v1=zz"},
    }[case]
    response = post(body=body, **kwargs)
    assert response.status_code == 400, response.content
    assert response["Content-Type"].startswith("application/problem+json")
    assert response.json()["code"] == "invalid_signature"
    assert not InboxMessage.objects.exists()


@pytest.mark.django_db
def test_a_replayed_delivery_with_an_old_timestamp_is_rejected():
    event = event_for({"key": "k", "reference": "order-x", "amount": "1.00", "currency": "EUR"})
    body = json.dumps(event).encode()
    old = int(time.time()) - 3600
    header = webhooks.sign(secret=settings.PAYMENTS_WEBHOOK_SECRET, timestamp=old, body=body)
    response = post(body=body, header=header)
    assert response.status_code == 400 and response.json()["code"] == "invalid_signature"
    assert not InboxMessage.objects.exists()


def database_time() -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT EXTRACT(EPOCH FROM statement_timestamp())::float")
        return float(cursor.fetchone()[0])


@pytest.mark.django_db
@pytest.mark.parametrize("skew", [+360, -360])
def test_the_window_is_judged_by_the_database_clock_not_the_hosts(monkeypatch, skew):
    # A host whose clock is 6 minutes off (the chaos run's skewed host runs 5
    # ahead) must accept what the database clock calls fresh and refuse what
    # it calls stale, whatever its own clock says.
    fresh_event = {"id": "evt_skew_fresh", "type": "customer.created", "created": 1, "data": {}}
    stale_event = {"id": "evt_skew_stale", "type": "customer.created", "created": 1, "data": {}}
    now = int(database_time())
    true_time = time.time
    monkeypatch.setattr(time, "time", lambda: true_time() + skew)
    fresh = post(fresh_event, t=now)
    assert fresh.status_code == 200, fresh.content
    stale = post(stale_event, t=now - webhooks.TOLERANCE_SECONDS - 30)
    assert stale.status_code == 400 and stale.json()["code"] == "invalid_signature"
    assert list(InboxMessage.objects.values_list("message_id", flat=True)) == ["evt_skew_fresh"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body, code",
    [
        (b"{not json", "malformed_json"),
        (b"[1, 2]", "invalid_request"),
        (json.dumps({"type": "charge.captured", "created": 1, "data": {}}).encode(),
         "invalid_request"),
        (json.dumps({"id": "evt_1", "type": "charge.captured", "created": 1,
                     "data": {"provider_key": "k", "reference": "r", "currency": "EUR"}}).encode(),
         "invalid_request"),
        (json.dumps({"id": "evt_1", "type": "charge.captured", "created": 1,
                     "data": {"provider_key": "k", "reference": "r", "currency": "EUR",
                              "amount": "lots"}}).encode(),
         "invalid_request"),
    ],
    ids=["not_json", "not_object", "missing_id", "missing_amount", "bad_amount"],
)  # fmt: skip
def test_correctly_signed_bad_bodies_are_400_and_nothing_is_stored(body, code):
    response = post(body=body)
    assert response.status_code == 400, response.content
    assert response.json()["code"] == code
    assert not InboxMessage.objects.exists()


@pytest.mark.django_db
def test_unknown_event_type_is_200_and_recorded_as_ignored():
    event = {"id": "evt_other", "type": "customer.created", "created": 1, "data": {}}
    response = post(event)
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "ignored"
    row = InboxMessage.objects.get()
    assert (row.consumer, row.message_id, row.status) == (
        "payments.provider",
        "evt_other",
        "ignored",
    )


@pytest.mark.django_db
def test_a_body_over_the_limit_is_413(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    event = {"id": "evt_big", "type": "customer.created", "created": 1, "data": {"x": "y" * 2000}}
    response = post(event)
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"
    assert not InboxMessage.objects.exists()


@pytest.mark.django_db
def test_endpoint_is_unauthenticated_and_csrf_exempt():
    event = {"id": "evt_csrf", "type": "customer.created", "created": 1, "data": {}}
    response = post(event, client=Client(enforce_csrf_checks=True))
    assert response.status_code == 200


@pytest.mark.django_db
def test_the_webhook_is_in_the_openapi_schema(api_client):
    paths = api_client.get("/api/schema/", HTTP_ACCEPT="application/json").json()["paths"]
    operation = paths[URL]["post"]
    assert any(p["name"] == "Shop-Signature" and p["required"] for p in operation["parameters"])
    assert {"200", "400", "413"} <= set(operation["responses"])


def test_verify_signature_compares_in_constant_time(monkeypatch):
    calls = []
    real = webhooks.hmac.compare_digest
    monkeypatch.setattr(
        webhooks.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b)
    )
    body = b"{}"
    header = webhooks.sign(secret="s", timestamp=int(time.time()), body=body)
    webhooks.verify_signature(header=header + ",v1=00", body=body, secret="s")
    assert len(calls) == 2  # every candidate compared, with hmac.compare_digest


# -- one effect: duplicates, races, order, unmatched --------------------------------


@transactional
def test_duplicate_webhook_has_one_effect(provider, settled_calls):
    payment, op = pending_capture(provider)
    event = event_for(op)
    before = duplicates()
    first, second = post(event), post(event)
    assert first.status_code == second.status_code == 200
    assert (first.json()["status"], second.json()["status"]) == ("applied", "duplicate")
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.CAPTURED
    assert payment.amount_captured == Decimal("42.00")
    assert transitions(payment, "captured") == 1
    assert [c["outcome"] for c in settled_calls] == ["succeeded"]  # the order side told once
    assert InboxMessage.objects.filter(message_id=event["id"]).count() == 1
    assert duplicates() == before + 1
    # The capture's settlement row was closed by the same transition: settling is a no-op.
    settlement = settle_due(payment)
    assert settlement.settled_at is not None and settlement.attempts == 0
    assert len(settled_calls) == 1
    assert_reconciled()


@transactional
def test_concurrent_duplicate_deliveries_have_one_effect(provider, settled_calls):
    payment, op = pending_capture(provider)
    event = event_for(op)
    before = duplicates()
    barrier = threading.Barrier(3)
    workers = Workers()

    def deliver():
        barrier.wait()
        return post(event).json()["status"]

    with transaction.atomic():
        payment_lock(payment_id=payment.id)  # hold the payment: the first delivery waits on it
        for _ in range(2):
            workers.start(deliver)
        barrier.wait()
        # Overlap proven: one delivery waits for the payment, the other for its inbox row.
        wait_for_lock_waiters(2)
    assert sorted(workers.join()) == ["applied", "duplicate"]
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.CAPTURED
    assert transitions(payment, "captured") == 1
    assert len(settled_calls) == 1
    assert duplicates() == before + 1
    assert_reconciled()


@transactional
def test_webhook_and_settlement_deciding_at_once_make_one_effect(provider, settled_calls):
    payment, op = pending_capture(provider)
    event = event_for(op)
    barrier = threading.Barrier(3)
    workers = Workers()

    def deliver():
        barrier.wait()
        return ("webhook", post(event).json()["status"])

    def settle():
        barrier.wait()
        return ("settlement", settle_due(payment).settled_at is not None)

    with transaction.atomic():
        payment_lock(payment_id=payment.id)
        workers.start(deliver)
        workers.start(settle)
        barrier.wait()
        wait_for_lock_waiters(2)  # both wait for the same payment row: a real race
    results = dict(workers.join())
    assert results["settlement"] is True
    assert results["webhook"] in ("applied", "no_effect")
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.CAPTURED
    assert payment.amount_captured == Decimal("42.00")  # not twice
    assert transitions(payment, "captured") == 1
    assert len(settled_calls) == 1  # whichever won told the order side, once
    assert_reconciled()


@transactional
def test_out_of_order_and_repeated_webhooks_have_one_effect_each(provider, settled_calls):
    captures = [pending_capture(provider) for _ in range(3)]
    events = [event_for(op) for _, op in captures]
    refund = event_for(
        {**captures[0][1], "key": captures[0][1]["key"] + "-refund"}, "refund.succeeded"
    )
    # The refund first (before the charge it refunds), then the charges newest
    # first, each delivered again later.
    order = [refund, events[2], events[0], events[1], events[2], refund, events[0]]
    statuses = [post(event).json()["status"] for event in order]
    assert statuses == [
        "unmatched", "applied", "applied", "applied", "duplicate", "duplicate", "duplicate"
    ]  # fmt: skip
    for payment, _ in captures:
        payment.refresh_from_db()
        assert payment.status == PaymentStatus.CAPTURED
        assert transitions(payment, "captured") == 1
    assert len(settled_calls) == 3
    row = InboxMessage.objects.get(message_id=refund["id"])
    assert (row.message_type, row.status) == ("refund.succeeded", "unmatched")
    assert_reconciled()


@transactional
def test_event_for_an_unknown_payment_is_stored_and_applied_when_settlement_meets_it(
    provider, settled_calls
):
    """The webhook comes before the shop knows the payment; its capture then gets no answer."""
    reference = f"order-{uuid.uuid4().hex[:8]}"
    key = provider_key(install=install_id(), reference=reference, kind="capture")
    charged = SimulatorGateway().capture(
        key=key, amount=Decimal("42.00"), currency="EUR", reference=reference,
        payment_method="pm_card_ok",
    )  # fmt: skip
    event = event_for(charged.operation)
    assert post(event).json()["status"] == "unmatched"
    assert InboxMessage.objects.get(message_id=event["id"]).status == "unmatched"

    payment = make_payment("pm_card_ok", reference=reference)
    provider.faults(refuse_connections=True)  # the shop's own call learns nothing
    result = payment_capture(payment_id=payment.id)
    provider.faults(refuse_connections=False)
    assert result.outcome == "succeeded"  # the stored event, through the same transition
    assert transitions(payment, "captured") == 1
    row = InboxMessage.objects.get(message_id=event["id"])
    assert row.status == "applied" and row.processed_at is not None
    assert PaymentSettlement.objects.get(transaction__payment=payment).settled_at is not None
    # Delivered again: a duplicate, no second effect.
    assert post(event).json()["status"] == "duplicate"
    assert len(provider.charges(key)) == 1
    assert_reconciled()


@transactional
def test_event_arriving_after_the_shop_recorded_the_outcome_has_no_effect(provider, settled_calls):
    payment = make_payment("pm_card_ok")
    assert payment_capture(payment_id=payment.id).outcome == "succeeded"
    (op,) = provider.charges(payment.transactions.get().provider_key)
    assert post(event_for(op)).json()["status"] == "no_effect"
    assert transitions(payment, "captured") == 1
    assert settled_calls == []


@transactional
def test_charge_failed_for_a_captured_payment_is_suspicious_and_changes_nothing(
    provider, settled_calls, caplog
):
    payment = make_payment("pm_card_ok")
    payment_capture(payment_id=payment.id)
    (op,) = provider.charges(payment.transactions.get().provider_key)
    with caplog.at_level(logging.WARNING, logger="payments.webhooks"):
        response = post(event_for(op, "charge.failed"))
    assert response.status_code == 200 and response.json()["status"] == "suspicious"
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.CAPTURED
    assert any(r.levelno == logging.WARNING and "suspicious" in r.message for r in caplog.records)
    assert InboxMessage.objects.get().status == "suspicious"


@transactional
@pytest.mark.parametrize("data", [{"amount": "41.00"}, {"currency": "USD"}])
def test_other_amount_or_currency_is_suspicious_and_not_applied(
    provider, settled_calls, caplog, data
):
    payment, op = pending_capture(provider)
    with caplog.at_level(logging.WARNING, logger="payments.webhooks"):
        assert post(event_for(op, **data)).json()["status"] == "suspicious"
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.PENDING
    assert settled_calls == []
    assert any(r.levelno == logging.WARNING for r in caplog.records)


@transactional
def test_charge_failed_for_a_pending_payment_fails_it_once(provider, settled_calls):
    payment = make_payment("pm_card_declined")
    # Prepared but the call lost before the provider: then the provider's own event.
    provider.faults(refuse_connections=True)
    assert payment_capture(payment_id=payment.id).outcome == "unknown"
    provider.faults(refuse_connections=False)
    key = payment.transactions.get().provider_key
    declined = SimulatorGateway().capture(
        key=key, amount=Decimal("42.00"), currency="EUR", reference=payment.reference,
        payment_method="pm_card_declined",
    )  # fmt: skip
    event = event_for(declined.operation, "charge.failed")
    assert [post(event).json()["status"] for _ in range(2)] == ["applied", "duplicate"]
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.FAILED
    assert [c["outcome"] for c in settled_calls] == ["declined"]
    assert_reconciled()


# -- the simulator delivers, really ------------------------------------------------


class Receiver:
    """A stub webhook endpoint that verifies every signature; answers `fail_first` 503s."""

    def __init__(self, *, fail_first: int = 0) -> None:
        self.deliveries: list[dict] = []
        self.rejected = 0
        self.fail_first = fail_first
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                header = self.headers.get("Shop-Signature")
                status = receiver.receive(body, header)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def receive(self, body: bytes, header: str | None) -> int:
        try:
            t = webhooks.verify_signature(
                header=header, body=body, secret=settings.PAYMENTS_WEBHOOK_SECRET
            )
        except webhooks.InvalidSignature:
            with self._lock:
                self.rejected += 1
            return 400
        with self._lock:
            if self.fail_first > 0:
                self.fail_first -= 1
                return 503
            self.deliveries.append({"t": t, "header": header, "event": json.loads(body)})
        return 200

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    stub = Receiver()
    yield stub
    stub.stop()


def charge(sim: Simulator, method="pm_card_ok", reference=None) -> dict:
    reference = reference or f"order-{uuid.uuid4().hex[:8]}"
    result = SimulatorGateway(base_url=sim.url, timeout=5).capture(
        key=f"test:{reference}:capture", amount=Decimal("10.00"), currency="EUR",
        reference=reference, payment_method=method,
    )  # fmt: skip
    return result.operation


def test_simulator_delivers_signed_webhooks_and_duplicates_when_asked(tmp_path, receiver):
    sim = Simulator(tmp_path, webhook_url=receiver.url).start()
    try:
        op = charge(sim)
        wait_until(lambda: len(receiver.deliveries) == 1, what="one delivery")
        sim.faults(webhook_duplicate_rate=1.0)
        twice = charge(sim)
        declined = charge(sim, method="pm_card_declined")
        wait_until(lambda: len(receiver.deliveries) == 5, what="two more events, each twice")
        time.sleep(0.3)
        assert len(receiver.deliveries) == 5 and receiver.rejected == 0
    finally:
        sim.stop()
    by_key: dict[str, list[dict]] = {}
    for delivery in receiver.deliveries:
        by_key.setdefault(delivery["event"]["data"]["provider_key"], []).append(delivery)
    assert [d["event"]["type"] for d in by_key[op["key"]]] == ["charge.captured"]
    first, again = by_key[twice["key"]]
    assert first["event"] == again["event"]  # the same event id and body
    assert first["event"]["data"] == {
        "provider_key": twice["key"], "reference": twice["reference"], "amount": "10.00",
        "currency": "EUR", "operation_id": twice["id"],
    }  # fmt: skip
    assert {d["event"]["type"] for d in by_key[declined["key"]]} == {"charge.failed"}


def test_simulator_retries_until_2xx_and_survives_a_restart(tmp_path):
    receiver = Receiver(fail_first=10**6)  # down: every delivery answered 503
    sim = Simulator(tmp_path, webhook_url=receiver.url).start()
    try:
        op = charge(sim)
        wait_until(
            lambda: sim.state()["webhooks"]["stats"].get("failed", 0) >= 2, what="two retries"
        )
        sim.kill()  # SIGKILL: the queue is the ledger, nothing else
        receiver.fail_first = 0
        sim.start()
        wait_until(lambda: len(receiver.deliveries) == 1, timeout=30, what="the late delivery")
        (event,) = sim.webhook_events(op["key"])
        assert event["delivered_at"] and event["sends_left"] == 0 and event["attempts"] >= 2
    finally:
        sim.stop()
        receiver.stop()
    assert receiver.deliveries[0]["event"]["data"]["provider_key"] == op["key"]


def test_simulator_delay_sends_late_and_out_of_order(tmp_path, receiver):
    sim = Simulator(tmp_path, webhook_url=receiver.url).start()
    try:
        sim.faults(webhook_max_delay_ms=1500, webhooks_paused=True)
        ops = [charge(sim) for _ in range(10)]
        sim.faults(webhooks_paused=False)
        wait_until(lambda: len(receiver.deliveries) == 10, what="ten deliveries")
    finally:
        sim.stop()
    sent = [d["event"]["data"]["provider_key"] for d in receiver.deliveries]
    assert sorted(sent) == sorted(op["key"] for op in ops)
    # Ten uniform delays in 0..1.5 s keep their order with probability 1/10! (six
    # did with 1/720: seen failing once).
    assert sent != [op["key"] for op in ops]


# -- end to end: checkout, the simulator's webhook, gunicorn ---------------------------


@pytest.fixture
def hooked_shop(gunicorn, tmp_path, settings):
    """A gunicorn shop and a simulator that sends its webhooks to it (webhooks paused at first)."""
    sim_port = free_port()
    provider_url = f"http://127.0.0.1:{sim_port}"
    server = gunicorn(
        workers=2,
        PAYMENTS_PROVIDER_URL=provider_url,
        PAYMENTS_PROVIDER_TIMEOUT="2",
        DB_POOL_MAX="2",
    )
    (tmp_path / "sim").mkdir()
    sim = Simulator(tmp_path / "sim", webhook_url=server.url + URL)
    sim.port = sim_port
    sim.start()
    settings.PAYMENTS_PROVIDER_URL = sim.url
    yield server, sim
    sim.stop()


@transactional
@pytest.mark.slow
@pytest.mark.parametrize("arrives", ["after_202", "while_checkout_waits"])
def test_webhook_before_the_shop_recorded_the_capture_confirms_the_order_once(
    hooked_shop, make_product, make_user, arrives
):
    server, sim = hooked_shop
    make_product("TEE-M", price="19.99", stock=5)
    token = api_token_issue(user=make_user()).key
    # Every event sent twice: the simulator's own redelivery must be suppressed too.
    sim.faults(webhook_duplicate_rate=1.0, webhooks_paused=arrives == "after_202")
    response = requests.post(
        f"{server.url}/api/v1/orders/",
        json={
            "lines": [{"sku": "TEE-M", "quantity": 1}],
            "on_shortage": "reject",
            "payment_method": "pm_card_timeout",
            "shipping_address": ADDRESS,
        },
        headers={"Authorization": f"Token {token}", "Idempotency-Key": "hooked"},
        timeout=60,
    )
    order = Order.objects.get()
    if arrives == "after_202":
        # The answer was lost: the order waits for its payment, which is still pending.
        assert response.status_code == 202, response.content
        assert order.status == "payment_pending"
        assert order.payment.status == PaymentStatus.PENDING
        sim.faults(webhooks_paused=False)
    else:
        # The webhook was applied while the checkout waited for the lost answer;
        # the checkout's own recorder found the payment captured.
        assert response.status_code == 201, response.content
    wait_until(
        lambda: Order.objects.filter(status="confirmed").exists(), what="the order confirmed"
    )
    order.refresh_from_db()
    payment = order.payment
    assert payment.status == PaymentStatus.CAPTURED
    assert OrderEvent.objects.filter(order=order, line=None, kind="paid").count() == 1
    assert transitions(payment, "captured") == 1
    (row,) = InboxMessage.objects.filter(consumer=webhooks.SOURCE)
    assert (row.message_type, row.status) == ("charge.captured", "applied")
    # Settlement afterwards: nothing to do.
    settlement = PaymentSettlement.objects.get(transaction__payment=payment)
    assert settlement.settled_at is not None
    settle_due(payment)
    assert transitions(payment, "captured") == 1
    assert len(sim.charges(payment.transactions.get().provider_key)) == 1
    # The simulator's second delivery of the same event: 200, no second effect.
    wait_until(lambda: sim.webhook_events()[0]["deliveries"] == 2, what="the redelivery")
    assert transitions(payment, "captured") == 1
    assert OrderEvent.objects.filter(order=order, line=None, kind="paid").count() == 1
    assert InboxMessage.objects.filter(consumer=webhooks.SOURCE).count() == 1
    assert_reconciled()
