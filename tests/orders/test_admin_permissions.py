"""Every staff action and custom view of orders requires the model permission it changes.

A staff user who may only view gets 403 from the custom views (refund, cancel,
mark received, retry failed steps) and is not offered the changelist actions
(a forced POST changes nothing); a user holding the permission succeeds.
"""

from __future__ import annotations

import re

import pytest
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse

from orders.models import CompensationStep, Order, ReturnRequest
from payments.models import Refund
from tests.backoffice.attention_support import captured_payment, failed_step, grant, order_of

pytestmark = pytest.mark.django_db

VIEW = ("orders.view_order", "orders.view_returnrequest", "orders.view_compensationstep")


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer(make_user):
    user = make_user(staff=True, username="viewer")
    grant(user, *VIEW)
    return user


@pytest.fixture
def order(shopper):
    return order_of(captured_payment("20.00"), shopper)


def a_return(order, status: str = "requested") -> ReturnRequest:
    return ReturnRequest.objects.create(
        order=order,
        status=status,
        reason="too big",
        currency="EUR",
        refund_amount="10.00",
        received_at=None if status == "requested" else Now(),
    )


def key_of(page) -> str:
    return re.search(r'name="idempotency_key" value="([^"]+)"', page.content.decode()).group(1)


def offered(client, changelist: str) -> set[str]:
    page = client.get(changelist)
    assert page.status_code == 200
    return set(re.findall(r'<option value="(\w+)"', page.content.decode()))


# --- Refund (orders.refund_order) ------------------------------------------------------


def test_refund_needs_the_refund_order_permission(viewer, order, make_user):
    url = reverse("admin:orders_order_refund", args=[order.pk])
    client = login(viewer)
    assert "refund" not in offered(client, reverse("admin:orders_order_changelist"))
    forced = client.post(
        reverse("admin:orders_order_changelist"),
        {"action": "refund", "_selected_action": [order.pk]},
    )
    assert forced.get("Location") != url  # not sent on to the form
    assert client.get(url).status_code == 403
    body = {"amount": "5.00", "reason": "goodwill", "idempotency_key": "k-viewer"}
    assert client.post(url, body).status_code == 403
    assert not Refund.objects.exists()

    # "Change order" is not enough: refunding moves money.
    changer = make_user(staff=True, username="changer")
    grant(changer, *VIEW, "orders.change_order")
    assert login(changer).get(url).status_code == 403

    clerk = make_user(staff=True, username="clerk")
    grant(clerk, *VIEW, "orders.refund_order")
    client = login(clerk)
    assert "refund" in offered(client, reverse("admin:orders_order_changelist"))
    form = client.get(url)
    assert form.status_code == 200
    answer = client.post(url, {**body, "idempotency_key": key_of(form)})
    assert answer.status_code == 303
    assert Refund.objects.get().amount == 5


# --- Cancel order (orders.change_order) --------------------------------------------------


def test_cancel_order_needs_the_change_order_permission(viewer, order, make_user):
    url = reverse("admin:orders_order_cancel", args=[order.pk])
    client = login(viewer)
    assert "cancel_order" not in offered(client, reverse("admin:orders_order_changelist"))
    assert client.get(url).status_code == 403
    assert client.post(url, {"idempotency_key": "k-viewer"}).status_code == 403
    assert Order.objects.get(pk=order.pk).status == "confirmed"

    clerk = make_user(staff=True, username="clerk")
    grant(clerk, *VIEW, "orders.change_order")
    client = login(clerk)
    assert "cancel_order" in offered(client, reverse("admin:orders_order_changelist"))
    form = client.get(url)
    assert form.status_code == 200
    assert client.post(url, {"idempotency_key": key_of(form)}).status_code == 303
    assert Order.objects.get(pk=order.pk).status in ("cancelling", "cancelled")


# --- Returns: Mark received, Retry failed steps (orders.change_returnrequest) ------------


def test_mark_received_needs_the_change_return_permission(viewer, order, make_user):
    order_return = a_return(order)
    url = reverse("admin:orders_returnrequest_receive", args=[order_return.pk])
    client = login(viewer)
    assert "mark_received" not in offered(client, reverse("admin:orders_returnrequest_changelist"))
    assert client.get(url).status_code == 403
    assert client.post(url, {"idempotency_key": "k-viewer"}).status_code == 403
    assert ReturnRequest.objects.get(pk=order_return.pk).status == "requested"

    clerk = make_user(staff=True, username="clerk")
    grant(clerk, *VIEW, "orders.change_returnrequest")
    client = login(clerk)
    assert "mark_received" in offered(client, reverse("admin:orders_returnrequest_changelist"))
    form = client.get(url)
    assert form.status_code == 200
    assert client.post(url, {"idempotency_key": key_of(form)}).status_code == 303
    assert ReturnRequest.objects.get(pk=order_return.pk).status != "requested"


def test_retry_failed_steps_needs_the_change_return_permission(viewer, order, make_user):
    order_return = a_return(order, status="needs_attention")
    step = CompensationStep.objects.create(
        kind="return",
        order=order,
        order_return=order_return,
        name="notify",
        position=5,
        status="failed",
        needs_attention=True,
        attempts=8,
        last_error="SMTP refused",
    )
    url = reverse("admin:orders_returnrequest_retry", args=[order_return.pk])
    client = login(viewer)
    changelist = reverse("admin:orders_returnrequest_changelist")
    assert "retry_failed_steps" not in offered(client, changelist)
    assert client.get(url).status_code == 403
    assert client.post(url, {"idempotency_key": "k-viewer"}).status_code == 403
    assert CompensationStep.objects.get(pk=step.pk).status == "failed"

    clerk = make_user(staff=True, username="clerk")
    grant(clerk, *VIEW, "orders.change_returnrequest")
    client = login(clerk)
    assert "retry_failed_steps" in offered(client, changelist)
    form = client.get(url)
    assert client.post(url, {"idempotency_key": key_of(form)}).status_code == 303
    assert CompensationStep.objects.get(pk=step.pk).status == "pending"


# --- Compensation steps: Retry now (orders.change_compensationstep) ----------------------


def test_step_retry_now_needs_the_change_step_permission(viewer, order, make_user):
    step = failed_step(order)
    changelist = reverse("admin:orders_compensationstep_changelist")
    client = login(viewer)
    assert "retry_now" not in offered(client, changelist)
    client.post(changelist, {"action": "retry_now", "_selected_action": [step.pk]})
    assert CompensationStep.objects.get(pk=step.pk).status == "failed"

    clerk = make_user(staff=True, username="clerk")
    grant(clerk, *VIEW, "orders.change_compensationstep")
    client = login(clerk)
    assert "retry_now" in offered(client, changelist)
    client.post(changelist, {"action": "retry_now", "_selected_action": [step.pk]})
    assert CompensationStep.objects.get(pk=step.pk).status == "pending"


def test_the_demo_staff_user_may_do_everything(order):
    from django.contrib.auth import get_user_model

    from devtools.demo import seeding as demo

    staff = next(u for u in demo.DEMO_USERS if u.staff)
    demo._user_create(staff)  # as `make demo` makes it
    user = get_user_model().objects.get(username=staff.username)
    client = login(user)
    for name in ("admin:orders_order_refund", "admin:orders_order_cancel"):
        assert client.get(reverse(name, args=[order.pk])).status_code == 200
