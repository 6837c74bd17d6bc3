"""The machinery's staff actions require the model permission they change.

"Requeue" of dead letters (idempotency.change_deadletter) and deliveries
(idempotency.change_delivery), "Retry now" of outbox rows
(idempotency.change_outboxmessage): not offered to a view-only staff user,
a forced POST (the keyed confirmation included) changes nothing, and the
keyed confirmation refuses a caller without the permission (403).
"""

from __future__ import annotations

import re

import pytest
from django.db.models.functions import Now
from django.test import Client, RequestFactory
from django.urls import reverse

from idempotency.models import Delivery, OutboxMessage
from tests.backoffice.attention_support import captured_payment, dead_letter, grant, order_of

pytestmark = pytest.mark.django_db


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def offered(client, changelist: str) -> set[str]:
    page = client.get(changelist)
    assert page.status_code == 200
    return set(re.findall(r'<option value="(\w+)"', page.content.decode()))


def requeue(client, changelist: str, pk) -> None:
    asked = client.post(changelist, {"action": "retry_now", "_selected_action": [pk]})
    found = re.search(r'name="idempotency_key" value="([^"]+)"', asked.content.decode())
    key = found.group(1) if found else "forced-key"
    client.post(
        changelist,
        {"action": "retry_now", "_selected_action": [pk], "confirm": "yes", "idempotency_key": key},
    )


@pytest.fixture
def letter(shopper):
    return dead_letter(order_of(captured_payment(), shopper))


@pytest.mark.parametrize("model", ["deadletter", "delivery"])
def test_requeue_needs_the_change_permission(make_user, letter, model):
    changelist = reverse(f"admin:idempotency_{model}_changelist")
    viewer = make_user(staff=True, username="viewer")
    grant(viewer, f"idempotency.view_{model}")
    client = login(viewer)
    assert "retry_now" not in offered(client, changelist)
    requeue(client, changelist, letter.pk)
    assert Delivery.objects.get(pk=letter.pk).needs_attention

    clerk = make_user(staff=True, username="clerk")
    grant(clerk, f"idempotency.view_{model}", f"idempotency.change_{model}")
    client = login(clerk)
    assert "retry_now" in offered(client, changelist)
    requeue(client, changelist, letter.pk)
    assert not Delivery.objects.get(pk=letter.pk).needs_attention


def test_outbox_retry_now_needs_the_change_permission(make_user):
    row = OutboxMessage.objects.create(
        aggregate_type="t",
        aggregate_id="1",
        event_type="e",
        payload={},
        needs_attention=True,
        attempts=9,
        next_attempt_at=Now(),
    )
    changelist = reverse("admin:idempotency_outboxmessage_changelist")
    viewer = make_user(staff=True, username="viewer")
    grant(viewer, "idempotency.view_outboxmessage")
    client = login(viewer)
    assert "retry_now" not in offered(client, changelist)
    client.post(changelist, {"action": "retry_now", "_selected_action": [row.pk]})
    assert OutboxMessage.objects.get(pk=row.pk).needs_attention

    clerk = make_user(staff=True, username="clerk")
    grant(clerk, "idempotency.view_outboxmessage", "idempotency.change_outboxmessage")
    client = login(clerk)
    client.post(changelist, {"action": "retry_now", "_selected_action": [row.pk]})
    assert not OutboxMessage.objects.get(pk=row.pk).needs_attention


def test_the_keyed_confirmation_itself_refuses_without_the_permission(make_user, letter):
    from django.contrib import admin
    from django.core.exceptions import PermissionDenied

    from idempotency.admin_actions import keyed_action
    from idempotency.models import DeadLetter

    viewer = make_user(staff=True, username="viewer")
    grant(viewer, "idempotency.view_deadletter")
    request = RequestFactory().post("/", {"confirm": "yes", "idempotency_key": "k"})
    request.user = viewer
    with pytest.raises(PermissionDenied):
        keyed_action(
            admin.site._registry[DeadLetter],
            request,
            DeadLetter.objects.filter(pk=letter.pk),
            operation="admin.delivery.requeue",
            title="Requeue",
            explanation="",
            button="Requeue",
            decide=lambda pk: True,
            done_message=lambda changed, skipped: "",
        )
    assert Delivery.objects.get(pk=letter.pk).needs_attention
