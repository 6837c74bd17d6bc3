"""The lifetime test: every journey, every purge at retention 0, then everything sent again.

Exactly once must hold for an order's whole life, not only while a request
key lives (docs/idempotency.md, "Business scopes that outlive request keys").
So the test drives every journey to its end (API and storefront checkout,
ask and decide, a pending payment settled, goodwill refunds from the API and
the admin, a shipment from each door with a courier's tracking events, a
return received, cancellations with their compensation, a stock adjustment,
the provider's webhooks, the outbox's consumers and the e-mails); then runs
every purge at retention 0 (request keys, outbox and deliveries, mails,
sessions, and the inbox); then replays everything a browser, staff, the
provider, a courier, the broker and an API client can send again. Nothing
doubles: orders, charges, refunds, stock, points, purchase history, order
events, mails. An API key reused after its purge is the contract's one
documented exception; the test shows it is the only thing that acts again.

The worker and beat are played in this process (`Worker`): every task the
shop rings is recorded and run here, so each step is deterministic.
"""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from celery import current_app
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.core import mail
from django.core.management import call_command
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse

from idempotency.keys import keys_complete_abandoned
from idempotency.messaging import relay
from idempotency.models import Delivery, IdempotencyKey, InboxMessage, OutboxMessage
from inventory.models import StockAdjustment, StockItem
from orders import tracking
from orders.models import CompensationStep, Order, OrderEvent, ReturnRequest, Shipment
from payments.models import Payment, PaymentEvent, Refund, RefundStatus
from payments.refunds import refund_run
from shop import emails
from shop.models import LoyaltyAccount, LoyaltyOrder, Mail, PurchaseHistoryLine
from tests.orders import conftest as orders_fixtures
from tests.orders.compensation_support import drive
from tests.orders.conftest import ADDRESS
from tests.orders.money_model_support import deliver_webhook
from tests.shop.conftest import add_to_cart, checkout_form, order_id_of
from tests.support.simulator import settle_due

pytestmark = pytest.mark.django_db(transaction=True)

provider = orders_fixtures.provider  # the payment simulator, a real process
KEY = re.compile(r'name="idempotency_key" value="([^"]+)"')
CONSUMER_TASKS = ("shop.consume_loyalty", "shop.consume_history", "shop.consume_emails")


class Worker:
    """Every task the shop rings, recorded; `run()` plays worker and beat until all is quiet."""

    def __init__(self) -> None:
        self.rung: list[tuple[str, list]] = []
        self.consumed: list[tuple[str, list]] = []  # consumer tasks as the broker delivered them

    def send_task(self, name, args=None, **_options):
        self.rung.append((name, list(args or [])))

    def run(self) -> None:
        for _ in range(40):
            relay.relay_for(5.0)
            drive(timeout=30.0)  # compensation steps and pending refunds
            for refund in Refund.objects.filter(status=RefundStatus.PENDING):
                Refund.objects.filter(id=refund.id).update(next_attempt_at=Now())
                refund_run(refund_id=refund.id)
            if not self.rung:
                return
            batch, self.rung = self.rung, []
            for name, args in batch:
                if name in CONSUMER_TASKS:
                    self.consumed.append((name, args))
                current_app.tasks[name].apply(args=args)
        raise AssertionError(f"the shop never got quiet: {self.rung[:5]}")


@pytest.fixture
def worker(monkeypatch, settings) -> Worker:
    settings.COMPENSATION_WAIT_SECONDS = 0.01
    settings.SHOP_EMAILS = True
    monkeypatch.setattr(relay, "_consumers", relay.consumers())  # restored after the test
    relay.register_consumer(
        emails.CONSUMER, task="shop.consume_emails", event_types=emails.EVENT_TYPES
    )
    current_app.loader.import_default_modules()  # every app's tasks, registered by name
    played = Worker()
    monkeypatch.setattr(current_app, "send_task", played.send_task)
    return played


@pytest.fixture
def catalog(make_product):
    make_product("TEE-M", price="10.00", stock=20, name="T-shirt, size M")
    make_product("MUG", price="5.00", stock=20, name="Enamel mug")
    make_product("CAP", price="8.00", stock=1, name="Baseball cap")
    make_product("PIN", price="2.00", stock=1, name="Enamel pin")


@pytest.fixture
def people(make_user, client_for, shopper):
    staff = make_user(staff=True, username="boss")
    staff.is_superuser = True
    staff.save(update_fields=["is_superuser"])
    return {
        "api": client_for(shopper),
        "staff_api": client_for(staff),
        "courier": client_for(make_user(courier=True)),
        "staff": staff,
        "shopper": shopper,
    }


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    client.user = user  # tests.shop.conftest.add_to_cart reads it
    return client


def key_of(page) -> str:
    assert page.status_code == 200, page.status_code
    return KEY.search(page.content.decode())[1]


def api_post(client, url: str, body: dict | None = None, *, key: str):
    return client.post(url, body or {}, format="json", HTTP_IDEMPOTENCY_KEY=key)


def order_body(lines: dict[str, int], *, method: str = "pm_card_ok", **extra) -> dict:
    return {
        "lines": [{"sku": sku, "quantity": q} for sku, q in lines.items()],
        "payment_method": method,
        "shipping_address": ADDRESS,
        **extra,
    }


def books(provider) -> dict:
    """Everything that must not double, as the shop and the provider hold it."""
    ledger = provider.ledger()
    return {
        "orders": sorted(Order.objects.values_list("number", "status", "fulfillment")),
        "charges": sorted(
            op["key"] for op in ledger if op["kind"] == "capture" and op["status"] == "succeeded"
        ),
        "provider_refunds": sorted(
            (op["key"], op["amount"]) for op in ledger if op["kind"] == "refund"
        ),
        "refunds": sorted(Refund.objects.values_list("id", "amount", "status")),
        "payments": sorted(
            Payment.objects.values_list(
                "id", "amount_captured", "refund_reserved", "amount_refunded"
            )
        ),
        "stock": sorted(StockItem.objects.values_list("product__sku", "on_hand", "reserved")),
        "stock_adjustments": StockAdjustment.objects.count(),
        "shipments": Shipment.objects.count(),
        "returns": sorted(ReturnRequest.objects.values_list("id", "status")),
        "steps": CompensationStep.objects.count(),
        "points": sorted(LoyaltyAccount.objects.values_list("user_id", "balance")),
        "loyalty_orders": sorted(
            LoyaltyOrder.objects.values_list("order_id", "earned", "reversed", "cancelled")
        ),
        "history": sorted(
            PurchaseHistoryLine.objects.values_list(
                "order_id", "sku", "quantity", "quantity_returned", "cancelled", "amount"
            )
        ),
        "order_events": OrderEvent.objects.count(),
        "payment_events": PaymentEvent.objects.count(),
        "tracking": sorted(
            (str(s.id), tracking.tracking_summary(shipment_id=s.id).distinct)
            for s in Shipment.objects.all()
        ),
        "mails_sent": sorted((m.to[0], m.subject) for m in mail.outbox),
    }


# The purges this test knows; any other beat task named "purge"/"clear" runs too.
KNOWN_PURGES = {"idempotency.purge_finished_keys", "idempotency.purge_outbox", "shop.purge_mail"}


def purge_everything(settings) -> None:
    """Every purge, at retention 0 (as if each retention had passed).

    Every `*_RETENTION` setting is 0 and every beat task whose name says it
    purges or clears runs once; what no task removes yet is removed as its
    purge would (the inbox: every row; sessions: each one expired, then
    Django's `clearsessions`). The tables are then empty: nothing a replay
    could lean on is left.
    """
    for name in dir(django_settings):
        if name.endswith("_RETENTION"):
            setattr(settings, name, 0)
    settings.IDEMPOTENCY_ABANDON_AFTER = 0
    keys_complete_abandoned()  # a key left open (nobody came back) is finished first
    purges = sorted(
        {
            entry["task"]
            for entry in django_settings.CELERY_BEAT_SCHEDULE.values()
            if "purge" in entry["task"] or "clear" in entry["task"]
        }
    )
    assert KNOWN_PURGES <= set(purges), purges
    for task in purges:
        current_app.tasks[task].apply()
    InboxMessage.objects.all().delete()  # no inbox purge task (yet): as one would
    session_model = _session_model()
    session_model.objects.update(expire_date=Now())
    call_command("clearsessions")
    assert not IdempotencyKey.objects.exists()  # no key was left open
    assert not OutboxMessage.objects.exists() and not Delivery.objects.exists()
    assert not Mail.objects.exists() and not InboxMessage.objects.exists()
    assert not session_model.objects.exists()


def _session_model():
    from importlib import import_module

    return import_module(django_settings.SESSION_ENGINE).SessionStore.get_model_class()


def test_nothing_doubles_after_every_purge_but_a_reused_api_key(
    worker, catalog, people, provider, settings
):
    api, staff_api, courier = people["api"], people["staff_api"], people["courier"]
    browser, admin = login(people["shopper"]), login(people["staff"])
    sent_again: list = []  # (what, callable, first answer): everything that can be sent again

    def send(what: str, call):
        answer = call()
        sent_again.append((what, call, answer_of(answer)))
        return answer

    # --- API checkout, paid at once.
    placed = api_post(api, "/api/v1/orders/", order_body({"TEE-M": 3}), key="o-1")
    assert placed.status_code == 201, placed.content
    paid = Order.objects.get(id=placed.json()["id"])

    # --- Ask and decide: 2 caps asked, 1 on hand; the shopper confirms what is reserved.
    asked = api_post(api, "/api/v1/orders/", order_body({"CAP": 2}, on_shortage="ask"), key="o-ask")
    assert asked.json()["status"] == "awaiting_decision", asked.content
    confirm_url = f"/api/v1/orders/{asked.json()['id']}/confirm/"
    assert send("api confirm", lambda: api_post(api, confirm_url, key="c-1")).status_code == 200

    # --- A pending payment, settled while nobody asks; the key's retry then stores 201.
    pending_body = order_body({"MUG": 2}, method="pm_card_timeout")
    pending = api_post(api, "/api/v1/orders/", pending_body, key="o-pending")
    assert pending.status_code == 202, pending.content
    settled = Order.objects.get(id=pending.json()["id"])
    settle_due(settled.payment)
    assert api_post(api, "/api/v1/orders/", pending_body, key="o-pending").status_code == 201

    # --- Ask and decide in the storefront: 2 pins asked, 1 on hand; "Confirm order".
    add_to_cart(browser, "PIN", 2)
    asked_page = browser.post("/checkout/", checkout_form(browser, on_shortage="ask"))
    shop_asked = Order.objects.get(id=order_id_of(asked_page))
    assert shop_asked.status == "awaiting_decision"
    page = browser.get(f"/orders/{shop_asked.id}/").content.decode()
    decide = {"idempotency_key": form_key_of(page, "/confirm/")}
    decide_url = f"/orders/{shop_asked.id}/confirm/"
    assert send("storefront confirm", lambda: browser.post(decide_url, decide)).status_code == 303
    assert Order.objects.get(id=shop_asked.id).status == "partially_confirmed"

    # --- Storefront checkout (its replay after the purge: the next test).
    add_to_cart(browser, "MUG", 1)
    shop_order = Order.objects.get(
        id=order_id_of(browser.post("/checkout/", checkout_form(browser)))
    )
    assert shop_order.status == "confirmed"

    # --- Goodwill refunds: the API's and the admin form's.
    refunds_url = f"/api/v1/orders/{paid.id}/refunds/"
    refund_body = {"amount": "3.00", "currency": "EUR", "reason": "late"}
    assert api_post(staff_api, refunds_url, refund_body, key="r-1").status_code == 201
    refund_form = reverse("admin:orders_order_refund", args=[paid.pk])
    form = {
        "amount": "2.00",
        "reason": "scratched",
        "idempotency_key": key_of(admin.get(refund_form)),
    }
    assert send("admin refund", lambda: admin.post(refund_form, form)).status_code == 303

    # --- Shipments: the API's (1 tee) and the admin form's (1 more), tracked by a courier.
    ship_url = f"/api/v1/orders/{paid.id}/shipments/"
    shipped = api_post(staff_api, ship_url, {"lines": [{"sku": "TEE-M", "quantity": 1}]}, key="s-1")
    assert shipped.status_code == 201, shipped.content
    ship_form_url = f"/admin/orders/order/{paid.pk}/ship/"
    ship_form = {
        "idempotency_key": key_of(admin.get(ship_form_url)),
        "ship-TEE-M": "1",
        "carrier": "dhl",
        "tracking_number": "TRK-1",
    }
    assert send("admin shipment", lambda: admin.post(ship_form_url, ship_form)).status_code == 303
    tracking_url = f"/api/v1/shipments/{shipped.json()['id']}/tracking-events/"
    for event_id, status in (("ev-1", "in_transit"), ("ev-2", "delivered")):
        event = {
            "event_id": event_id,
            "status": status,
            "occurred_at": f"2026-05-0{event_id[-1]}T10:00:00Z",
            "location": "Hub A",
        }
        answer = send(
            f"tracking {event_id}",
            lambda event=event: courier.post(tracking_url, event, format="json"),
        )
        assert answer.status_code == 202, answer.content

    # --- A return from the storefront form, received by staff: refund, restock, points back.
    return_url = f"/orders/{paid.id}/return/"
    html = browser.get(return_url).content.decode()
    tee = paid.lines.get(sku="TEE-M")
    return_form = {
        "idempotency_key": KEY.search(html)[1],
        "reason": "too small",
        f"quantity_{tee.id}": "1",
    }
    assert send("return form", lambda: browser.post(return_url, return_form)).status_code == 303
    (made,) = ReturnRequest.objects.filter(order=paid)
    return_page = reverse("admin:orders_returnrequest_change", args=[made.pk])
    receive_url = reverse("admin:orders_returnrequest_receive", args=[made.pk])
    receive = {"idempotency_key": form_key_of(admin.get(return_page).content.decode(), "/receive/")}
    assert send("admin mark received", lambda: admin.post(receive_url, receive)).status_code == 303
    # The API's receive under its own key, a moment later: the state decides (no effect).
    api_receive = f"/api/v1/returns/{made.id}/receive/"
    assert (
        send("api receive", lambda: api_post(staff_api, api_receive, key="rcv-1")).status_code < 300
    )

    # --- Cancellations with compensation: the storefront's, the admin's and the API's.
    page = browser.get(f"/orders/{shop_order.id}/").content.decode()
    cancel = {"idempotency_key": form_key_of(page, "/cancel/")}
    cancel_url = f"/orders/{shop_order.id}/cancel/"
    assert send("storefront cancel", lambda: browser.post(cancel_url, cancel)).status_code == 303
    api_cancel_url = f"/api/v1/orders/{settled.id}/cancel/"
    assert send("api cancel", lambda: api_post(api, api_cancel_url, key="x-1")).status_code < 300
    by_staff = api_post(api, "/api/v1/orders/", order_body({"MUG": 1}), key="o-staff-cancel")
    assert by_staff.status_code == 201, by_staff.content
    staff_cancel_url = reverse("admin:orders_order_cancel", args=[by_staff.json()["id"]])
    staff_cancel = {"idempotency_key": key_of(admin.get(staff_cancel_url))}
    assert (
        send("admin cancel", lambda: admin.post(staff_cancel_url, staff_cancel)).status_code == 303
    )

    # --- The admin's "Adjust stock".
    stock = StockItem.objects.get(product__sku="CAP")
    adjust_url = reverse("admin:inventory_stockitem_adjust", args=[stock.pk])
    adjust = {
        "idempotency_key": key_of(admin.get(adjust_url)),
        "mode": "delta",
        "quantity": "4",
        "reason": "found a box",
    }
    assert send("admin adjust", lambda: admin.post(adjust_url, adjust)).status_code == 303

    # --- The worker and beat until all is quiet; then the provider's webhooks, every one.
    worker.run()
    webhooks = provider.webhook_events()
    assert webhooks, "the simulator records an event per operation"
    for row in webhooks:
        assert send(f"webhook {row['id']}", lambda row=row: deliver_webhook(row)) < 300
    worker.run()
    consumed = list(worker.consumed)
    assert {name for name, _ in consumed} == set(CONSUMER_TASKS)

    for order in Order.objects.all():
        order.refresh_from_db()
    assert Order.objects.get(id=shop_order.id).status == "cancelled"
    assert Order.objects.get(id=settled.id).status == "cancelled"
    assert Order.objects.get(id=by_staff.json()["id"]).status == "cancelled"
    assert ReturnRequest.objects.get().status == "completed"
    before = books(provider)
    assert len(before["charges"]) == 6 and len(before["refunds"]) == 6
    assert len(before["mails_sent"]) >= 6 and before["points"] and before["history"]

    # --- Every purge at retention 0.
    purge_everything(settings)

    # --- Everything sent again: browser, staff, courier, provider, broker, completer.
    # The sessions are gone: the same people log in again (the forms' closures read these).
    browser.force_login(people["shopper"])
    admin.force_login(people["staff"])
    for what, call, first in sent_again:
        answer = answer_of(call())
        if what.startswith("api "):
            # A decision's API key after its purge is a new request on the state as it is
            # now (e.g. 200 `cancelled` where the first answer was 202 `cancelling`).
            assert 200 <= answer[0] < 300, (what, answer)
        else:
            # A form, a webhook, a tracking event: the same answer as the first time.
            assert answer == first, what
    for name, args in consumed:  # the broker redelivers every consumer message
        current_app.tasks[name].apply(args=args)
    keys_complete_abandoned()
    worker.run()
    assert books(provider) == before
    assert not Mail.objects.exists()  # no mail row was made again, so none is sent

    # --- The one exception: an API client's key reused after its purge is a new request.
    # Only the keys whose request makes a new object act again (an order, a refund, a
    # shipment); the keys of a decision on a state (confirm, cancel, receive) replayed
    # above changed nothing.
    again = api_post(api, "/api/v1/orders/", order_body({"TEE-M": 3}), key="o-1")
    assert again.status_code == 201 and again.json()["id"] != str(paid.id)
    assert api_post(staff_api, refunds_url, refund_body, key="r-1").status_code == 201
    one_tee = {"lines": [{"sku": "TEE-M", "quantity": 1}]}
    assert api_post(staff_api, ship_url, one_tee, key="s-1").status_code == 201
    worker.run()
    after = books(provider)
    assert len(after["orders"]) == len(before["orders"]) + 1
    assert len(after["charges"]) == len(before["charges"]) + 1
    assert len(after["refunds"]) == len(before["refunds"]) + 1
    assert after["shipments"] == before["shipments"] + 1
    assert on_hand(after, "TEE-M") == on_hand(before, "TEE-M") - 3
    unchanged = ("returns", "steps", "stock_adjustments")
    assert {name: after[name] for name in unchanged} == {name: before[name] for name in unchanged}
    assert len(after["loyalty_orders"]) == len(before["loyalty_orders"]) + 1  # the new order's


def on_hand(books_: dict, sku: str) -> int:
    return next(units for row_sku, units, _ in books_["stock"] if row_sku == sku)


def answer_of(answer) -> tuple:
    """What a sender sees of an answer: its status and, for a redirect, where it leads."""
    if isinstance(answer, int):  # deliver_webhook answers the status only
        return (answer,)
    return (answer.status_code, answer.headers.get("Location", ""))


def form_key_of(html: str, action: str) -> str:
    """The key of the order page's form posting to `action` (confirm, cancel)."""
    form = re.search(rf'action="[^"]*{action}".*?</form>', html, re.S)[0]
    return KEY.search(form)[1]


def test_a_storefront_checkout_sent_again_after_its_key_was_purged_orders_once(
    worker, catalog, people, provider, settings
):
    """The checkout answers `payment_pending`, the tab is closed, settlement confirms the
    order, the key is purged; the same "Place order" sent again is the same order."""
    browser = login(people["shopper"])
    add_to_cart(browser, "MUG", 1)
    form = checkout_form(browser, payment_method="pm_card_timeout")
    first = browser.post("/checkout/", form)
    order = Order.objects.get(id=order_id_of(first))
    assert order.status == "payment_pending"
    settle_due(order.payment)
    worker.run()
    assert Order.objects.get(id=order.id).status == "confirmed"
    purge_everything(settings)
    browser = login(people["shopper"])
    browser.post("/checkout/", form)
    assert Order.objects.count() == 1
    assert len([op for op in provider.ledger() if op["kind"] == "capture"]) == 1
    assert get_user_model().objects.get(id=people["shopper"].id).orders.count() == 1
    assert Decimal(StockItem.objects.get(product__sku="MUG").on_hand) == Decimal(19)
