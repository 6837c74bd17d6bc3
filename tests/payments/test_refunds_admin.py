"""Refunds in the admin, through Django's test client as staff: the order's "Refund" form
(keyed: a double submit or two tabs is one refund) and "Refunded outside the shop"."""

from __future__ import annotations

import re
from decimal import Decimal
from uuid import uuid4

import pytest
from django.test import Client
from django.urls import reverse

from orders.models import Order
from payments.models import Payment, Refund, RefundStatus
from payments.refunds import refund_run
from tests.payments.refund_support import provider_refunds
from tests.support.simulator import assert_reconciled

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def staff(make_user):
    user = make_user(staff=True, username="boss")
    user.is_superuser = True
    user.save()
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def paid_order(provider, make_product, shopper_client):
    from tests.orders.conftest import ADDRESS

    make_product("TEE-M", price="10.00", stock=10)
    response = shopper_client.post(
        "/api/v1/orders/",
        {
            "lines": [{"sku": "TEE-M", "quantity": 2}],
            "payment_method": "pm_card_ok",
            "shipping_address": ADDRESS,
        },
        format="json",
        HTTP_IDEMPOTENCY_KEY="order-1",
    )
    assert response.status_code == 201, response.content
    return Order.objects.get(id=response.json()["id"])


def form_key(page) -> str:
    return re.search(r'name="idempotency_key" value="([^"]+)"', page.content.decode()).group(1)


def test_refund_action_form_double_submit_and_two_tabs_is_one_refund(staff, paid_order, provider):
    changelist = reverse("admin:orders_order_changelist")
    chosen = staff.post(changelist, {"action": "refund", "_selected_action": [paid_order.pk]})
    form_url = reverse("admin:orders_order_refund", args=[paid_order.pk])
    assert chosen.status_code == 302 and chosen["Location"] == form_url

    tab_1, tab_2 = staff.get(form_url), staff.get(form_url)
    assert tab_1.status_code == 200 and "20.00" in tab_1.content.decode()
    assert form_key(tab_1) == form_key(tab_2)  # the same state: the same key
    body = {"amount": "6.00", "reason": "scratched", "idempotency_key": form_key(tab_1)}
    answers = [staff.post(form_url, body) for _ in range(3)]  # double submit, second tab
    order_page = reverse("admin:orders_order_change", args=[paid_order.pk])
    assert [(a.status_code, a["Location"]) for a in answers] == [(303, order_page)] * 3
    assert Refund.objects.count() == 1

    # Other values under the same key: refused, nothing more.
    other = staff.post(form_url, {**body, "amount": "7.00"})
    assert other.status_code == 422
    assert Refund.objects.count() == 1
    # A fresh form (the state moved) gets a new key.
    assert form_key(staff.get(form_url)) != body["idempotency_key"]

    refund = Refund.objects.get()
    refund_run(refund_id=refund.id)
    page = staff.get(order_page)
    assert page.status_code == 200 and str(refund.id) in page.content.decode()
    assert staff.get(reverse("admin:payments_refund_changelist")).status_code == 200
    assert len(provider_refunds(provider)) == 1
    assert_reconciled()


def test_invalid_form_claims_nothing(staff, paid_order):
    form_url = reverse("admin:orders_order_refund", args=[paid_order.pk])
    key = form_key(staff.get(form_url))
    page = staff.post(form_url, {"amount": "0", "reason": "x", "idempotency_key": key})
    assert page.status_code == 200
    assert Refund.objects.count() == 0
    too_much = staff.post(form_url, {"amount": "25.00", "reason": "x", "idempotency_key": key})
    assert too_much.status_code == 303 and "problem=" in too_much["Location"]
    assert Refund.objects.count() == 0
    assert Payment.objects.get(id=paid_order.payment_id).refund_reserved == 0
    retry_form = staff.get(too_much["Location"])
    assert "can still be refunded" in retry_form.content.decode()
    assert form_key(retry_form) != key  # a fresh key after a refusal


def test_refunded_outside_the_shop_records_once(staff, paid_order, provider):
    provider.faults(decline_refunds=True)
    form_url = reverse("admin:orders_order_refund", args=[paid_order.pk])
    key = form_key(staff.get(form_url))
    staff.post(form_url, {"amount": "5.00", "reason": "broken", "idempotency_key": key})
    refund = Refund.objects.get()
    refund_run(refund_id=refund.id)
    assert Refund.objects.get().status == RefundStatus.NEEDS_ATTENTION

    changelist = reverse("admin:payments_refund_changelist")
    action = {"action": "refunded_outside_shop", "_selected_action": [str(refund.pk)]}
    confirm = staff.post(changelist, action)
    assert confirm.status_code == 200 and "Refunded outside the shop" in confirm.content.decode()
    assert Refund.objects.get().status == RefundStatus.NEEDS_ATTENTION  # only asked
    key = form_key(confirm)
    assert form_key(staff.post(changelist, action)) == key  # a second tab: the same key
    answers = [
        staff.post(changelist, {**action, "confirm": "yes", "idempotency_key": key})
        for _ in range(2)  # a double click: the second is a replay
    ]
    assert [a.status_code for a in answers] == [303, 303]
    assert answers[1]["Idempotent-Replayed"] == "true"
    assert answers[0]["Location"] == changelist
    # Another confirmation (a new key) still changes nothing: the transition is conditional.
    other = staff.post(
        changelist, {**action, "confirm": "yes", "idempotency_key": "another-confirmation"}
    )
    assert other.status_code == 303
    refund.refresh_from_db()
    assert refund.status == RefundStatus.SUCCEEDED and refund.outside_shop
    payment = Payment.objects.get(id=paid_order.payment_id)
    assert payment.amount_refunded == Decimal("5.00")
    assert payment.events.filter(kind="transition", to_status="partially_refunded").count() == 1
    assert provider_refunds(provider) == []  # the provider was not called to refund
    assert_reconciled()


def test_accept_the_providers_refund_needs_the_change_permission(
    staff, make_user, paid_order, provider
):
    """The action that ends a late provider refund: a view-only staff user can change nothing."""
    from django.contrib.auth.models import Permission

    from payments.recording import refund_flag
    from payments.refund_decisions import refund_late_success, refund_record_failed
    from payments.refunds import refund_request

    made = refund_request(
        refund_id=uuid4(),
        payment_id=paid_order.payment_id,
        amount=Decimal("5.00"),
        reason="goodwill",
        origin="goodwill",
    )
    assert refund_flag(refund_id=made.id, reason="outcome unknown")
    assert refund_record_failed(refund_id=made.id)
    assert refund_late_success(refund_id=made.id)  # the provider's late word, as a webhook's
    from payments.selectors import refunds_needing_attention

    assert list(refunds_needing_attention().values_list("id", flat=True)) == [made.id]

    viewer = make_user(staff=True, username="viewer")
    viewer.user_permissions.add(Permission.objects.get(codename="view_refund"))
    client = Client()
    client.force_login(viewer)
    changelist = reverse("admin:payments_refund_changelist")
    action = {"action": "accept_provider_refund", "_selected_action": [str(made.pk)]}
    assert "accept_provider_refund" not in client.get(changelist).content.decode()
    forced = client.post(changelist, {**action, "confirm": "yes", "idempotency_key": "k1"})
    assert forced.status_code == 403
    assert Refund.objects.get(id=made.id).needs_attention  # nothing changed

    confirm = staff.post(changelist, action)
    assert confirm.status_code == 200 and "Accept the provider" in confirm.content.decode()
    done = staff.post(
        changelist, {**action, "confirm": "yes", "idempotency_key": form_key(confirm)}
    )
    assert done.status_code == 303
    row = Refund.objects.get(id=made.id)
    assert row.status == RefundStatus.SUCCEEDED and not row.needs_attention
    assert not refunds_needing_attention().exists()
