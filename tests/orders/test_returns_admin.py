"""Returns in the admin: keyed "Mark received" / "Retry failed steps" / "Cancel order" forms.

A double submit of one form is one action; the admin form and the scanner's
API call at the same moment (both inside `return_receive`, a barrier holds
them) start ONE run: one set of step rows.
"""

from __future__ import annotations

import re
import threading

import pytest
from celery import current_app
from django.db import connection
from django.test import Client

from idempotency.failpoints import hook
from orders.models import CompensationStep, Order, ReturnRequest
from tests.orders.compensation_support import ask_return, paid_order, receive, shipped_order

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def quiet_bells(monkeypatch):
    monkeypatch.setattr(current_app, "send_task", lambda *a, **kw: None)


@pytest.fixture
def staff(make_user):
    user = make_user(staff=True)
    user.is_superuser = True
    user.save(update_fields=["is_superuser"])
    return user


@pytest.fixture
def admin_client(staff):
    client = Client()
    client.force_login(staff)
    return client


@pytest.fixture
def requested(provider, make_product, shopper_client):
    make_product("TEE-M", price="10.00", stock=10)
    order = shipped_order(shopper_client, {"TEE-M": 2})
    return ReturnRequest.objects.get(
        id=ask_return(shopper_client, order, {"TEE-M": 1}).json()["id"]
    )


def form_key(client, url) -> str:
    page = client.get(url)
    assert page.status_code == 200
    return re.search(r'name="idempotency_key" value="([^"]+)"', page.content.decode()).group(1)


def test_mark_received_form_double_submit_is_one_run(admin_client, requested):
    url = f"/admin/orders/returnrequest/{requested.id}/receive/"
    key = form_key(admin_client, url)
    for _ in range(2):
        answer = admin_client.post(url, {"idempotency_key": key})
        assert answer.status_code == 303
    assert ReturnRequest.objects.get(id=requested.id).status == "processing"
    assert CompensationStep.objects.filter(order_return=requested).count() == 5
    page = admin_client.get(f"/admin/orders/returnrequest/{requested.id}/change/")
    assert page.status_code == 200 and b"restock" in page.content
    order_page = admin_client.get(f"/admin/orders/order/{requested.order_id}/change/")
    assert order_page.status_code == 200 and str(requested.id).encode() in order_page.content


def test_admin_form_and_scanner_at_once_start_one_run(admin_client, staff, client_for, requested):
    url = f"/admin/orders/returnrequest/{requested.id}/receive/"
    key = form_key(admin_client, url)
    scanner = client_for(staff)
    barrier = threading.Barrier(2, timeout=20)
    inside = []
    answers = {}

    def park(_name):
        inside.append(threading.get_ident())
        barrier.wait()

    def admin_submit():
        try:
            answers["admin"] = admin_client.post(url, {"idempotency_key": key}).status_code
        finally:
            connection.close()

    def scan():
        try:
            answers["api"] = receive(scanner, requested.id, key="scan-1").status_code
        finally:
            connection.close()

    with hook("returns.receive.before_decide", park):
        threads = [threading.Thread(target=admin_submit), threading.Thread(target=scan)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert len(inside) == 2  # both were inside the receive at the same moment
    assert answers == {"admin": 303, "api": 202}
    assert CompensationStep.objects.filter(order_return=requested).count() == 5
    assert requested.order.events.filter(kind="return_received").count() == 1


def test_cancel_order_form(admin_client, provider, make_product, shopper_client):
    make_product("TEE-M", price="10.00", stock=10)
    order = paid_order(shopper_client, {"TEE-M": 2})
    url = f"/admin/orders/order/{order.id}/cancel-order/"
    key = form_key(admin_client, url)
    assert admin_client.post(url, {"idempotency_key": key}).status_code == 303
    assert admin_client.post(url, {"idempotency_key": key}).status_code == 303
    assert Order.objects.get(id=order.id).status == "cancelling"
    assert CompensationStep.objects.filter(order=order, kind="cancellation").count() == 5


def test_retry_failed_steps_form(admin_client, staff_client, requested):
    receive(staff_client, requested.id)
    step = CompensationStep.objects.get(order_return=requested, name="refund")
    CompensationStep.objects.filter(id=step.id).update(status="failed", needs_attention=True)
    ReturnRequest.objects.filter(id=requested.id).update(status="needs_attention")
    url = f"/admin/orders/returnrequest/{requested.id}/retry/"
    key = form_key(admin_client, url)
    assert admin_client.post(url, {"idempotency_key": key}).status_code == 303
    step.refresh_from_db()
    assert step.status == "pending" and not step.needs_attention and step.attempts == 0
    assert ReturnRequest.objects.get(id=requested.id).status == "processing"


# --- Bulk "Mark received", search by order number and e-mail ---------------------------


def mark_received(client, ids, *, confirm_key=None):
    body = {"action": "mark_received", "_selected_action": [str(i) for i in ids]}
    if confirm_key is not None:
        body |= {"confirm": "yes", "idempotency_key": confirm_key}
    return client.post("/admin/orders/returnrequest/", body)


def test_bulk_mark_received_asks_then_receives_each_return_once(
    admin_client, requested, shopper_client
):
    other_order = shipped_order(shopper_client, {"TEE-M": 1}, key="order-2")
    other = ReturnRequest.objects.get(
        id=ask_return(shopper_client, other_order, {"TEE-M": 1}, key="ret-2").json()["id"]
    )
    ids = [requested.id, other.id]
    pages = [mark_received(admin_client, ids) for _ in range(2)]  # two tabs
    assert pages[0].status_code == 200 and b"Yes, mark received" in pages[0].content
    keys = [
        re.search(r'name="idempotency_key" value="([^"]+)"', p.content.decode()).group(1)
        for p in pages
    ]
    assert keys[0] == keys[1]
    answers = [mark_received(admin_client, ids, confirm_key=k) for k in keys]
    assert [a.status_code for a in answers] == [303, 303]
    for order_return in (requested, other):
        assert ReturnRequest.objects.get(id=order_return.id).status == "processing"
        assert CompensationStep.objects.filter(order_return=order_return).count() == 5
    listing = admin_client.get(answers[0]["Location"])
    assert "2 marked received; 0 unchanged (received already)." in [
        str(m) for m in listing.context["messages"]
    ]


def test_view_only_staff_cannot_mark_received(make_user, requested):
    from django.contrib.auth.models import Permission

    viewer = make_user(staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_returnrequest"))
    browser = Client()
    browser.force_login(viewer)
    assert mark_received(browser, [requested.id]).status_code == 403
    assert mark_received(browser, [requested.id], confirm_key="k-1").status_code == 403
    assert ReturnRequest.objects.get(id=requested.id).status == "requested"


def test_returns_and_steps_are_found_by_order_number_and_email(
    admin_client, staff_client, requested
):
    receive(staff_client, requested.id)
    order = requested.order
    for query in (str(order.number), order.owner.email):
        found = admin_client.get("/admin/orders/returnrequest/", {"q": query})
        assert [r.pk for r in found.context["cl"].result_list] == [requested.pk], query
        steps = admin_client.get("/admin/orders/compensationstep/", {"q": query})
        assert len(steps.context["cl"].result_list) == 5, query
    none = admin_client.get("/admin/orders/returnrequest/", {"q": "nobody@example.com"})
    assert list(none.context["cl"].result_list) == []


def test_payment_links_to_its_order_and_settlements_are_found(admin_client, requested):
    from payments.models import PaymentSettlement

    order = requested.order
    page = admin_client.get(f"/admin/payments/payment/{order.payment_id}/change/")
    assert f"/admin/orders/order/{order.pk}/change/" in page.content.decode()
    for query in (str(order.number), order.owner.email):
        payments = admin_client.get("/admin/payments/payment/", {"q": query})
        assert [p.pk for p in payments.context["cl"].result_list] == [order.payment_id]
        settlements = admin_client.get("/admin/payments/paymentsettlement/", {"q": query})
        assert {s.transaction.payment_id for s in settlements.context["cl"].result_list} <= {
            order.payment_id
        }
    expected = PaymentSettlement.objects.filter(transaction__payment_id=order.payment_id).count()
    found = admin_client.get("/admin/payments/paymentsettlement/", {"q": str(order.number)})
    assert len(found.context["cl"].result_list) == expected
