"""Payments' staff actions require the model permission they change.

Settlements' "Retry now" (payments.change_paymentsettlement); refunds' "Retry
now", "Refunded outside the shop" and "Record as failed" (payments.change_refund).
A view-only staff user is not offered them and a forced POST (the keyed
confirmation included) changes nothing; a user with the permission succeeds.
"""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from payments.models import PaymentSettlement, Refund
from tests.backoffice.attention_support import (
    captured_payment,
    flagged_refund,
    flagged_settlement,
    grant,
)

pytestmark = pytest.mark.django_db

VIEW = ("payments.view_payment", "payments.view_paymentsettlement", "payments.view_refund")


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def offered(client, changelist: str) -> set[str]:
    page = client.get(changelist)
    assert page.status_code == 200
    return set(re.findall(r'<option value="(\w+)"', page.content.decode()))


def confirm(client, changelist: str, action: str, pk) -> None:
    """Ask, then send the confirmation with its key (as a person would; forced when refused)."""
    asked = client.post(changelist, {"action": action, "_selected_action": [pk]})
    found = re.search(r'name="idempotency_key" value="([^"]+)"', asked.content.decode())
    key = found.group(1) if found else "forced-key"
    client.post(
        changelist,
        {"action": action, "_selected_action": [pk], "confirm": "yes", "idempotency_key": key},
    )


@pytest.fixture
def viewer(make_user):
    user = make_user(staff=True, username="viewer")
    grant(user, *VIEW)
    return user


def test_settlement_retry_now_needs_the_change_permission(viewer, make_user):
    settlement = flagged_settlement(captured_payment())
    changelist = reverse("admin:payments_paymentsettlement_changelist")
    client = login(viewer)
    assert "retry_now" not in offered(client, changelist)
    client.post(changelist, {"action": "retry_now", "_selected_action": [settlement.pk]})
    assert PaymentSettlement.objects.get(pk=settlement.pk).needs_attention

    clerk = make_user(staff=True, username="clerk")
    grant(clerk, *VIEW, "payments.change_paymentsettlement")
    client = login(clerk)
    assert "retry_now" in offered(client, changelist)
    client.post(changelist, {"action": "retry_now", "_selected_action": [settlement.pk]})
    assert not PaymentSettlement.objects.get(pk=settlement.pk).needs_attention


@pytest.mark.parametrize(
    ("action", "keyed", "after"),
    [
        ("retry_now", False, "pending"),
        ("refunded_outside_shop", True, "succeeded"),
        ("record_failed", True, "failed"),
    ],
)
def test_refund_actions_need_the_change_permission(viewer, make_user, action, keyed, after):
    refund = flagged_refund(captured_payment())
    changelist = reverse("admin:payments_refund_changelist")
    client = login(viewer)
    assert action not in offered(client, changelist)
    if keyed:
        confirm(client, changelist, action, refund.pk)
    else:
        client.post(changelist, {"action": action, "_selected_action": [refund.pk]})
    assert Refund.objects.get(pk=refund.pk).status == "needs_attention"

    clerk = make_user(staff=True, username="clerk")
    grant(clerk, *VIEW, "payments.change_refund")
    client = login(clerk)
    assert action in offered(client, changelist)
    if keyed:
        confirm(client, changelist, action, refund.pk)
    else:
        client.post(changelist, {"action": action, "_selected_action": [refund.pk]})
    assert Refund.objects.get(pk=refund.pk).status == after
