"""The admin shows the machinery's rows read-only."""

import pytest

from idempotency.keys import body_fingerprint, key_claim

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("model", ["idempotencykey", "outboxmessage", "inboxmessage"])
def test_admin_lists_rows_read_only(client, make_user, model):
    staff = make_user(staff=True)
    staff.is_superuser = True
    staff.save()
    key_claim(
        owner_id=staff.pk,
        key="k",
        operation="x",
        method="POST",
        path="/",
        fingerprint=body_fingerprint({}),
    )
    client.force_login(staff)
    assert client.get(f"/admin/idempotency/{model}/").status_code == 200
    assert client.get(f"/admin/idempotency/{model}/add/").status_code == 403


def test_a_refused_keyed_action_goes_back_to_its_changelist_with_the_title(rf, make_user):
    """Not the admin index with no message (idempotency.admin_actions.redirect_to_value)."""
    from django.contrib import admin
    from django.contrib.auth.models import Permission
    from django.contrib.messages import get_messages
    from django.contrib.messages.storage.fallback import FallbackStorage

    from core.errors import Conflict
    from idempotency.admin_actions import keyed_action
    from idempotency.models import IdempotencyKey

    staff = make_user(staff=True)
    # keyed_action requires the model's change permission (core.admin.require_permission).
    staff.user_permissions.add(Permission.objects.get(codename="change_idempotencykey"))
    staff = type(staff).objects.get(pk=staff.pk)  # a fresh permission cache
    key_admin = admin.site._registry[IdempotencyKey]
    key_claim(owner_id=staff.pk, key="row", operation="x", method="POST", path="/", fingerprint="f")
    request = rf.post(
        "/admin/idempotency/idempotencykey/",
        {"confirm": "yes", "idempotency_key": "confirm-1", "action": "refuse"},
    )
    request.user = staff
    request.session = {}
    request._messages = FallbackStorage(request)

    def refuse(pk):
        raise Conflict("Someone else decided it first.", code="already_decided")

    response = keyed_action(
        key_admin,
        request,
        IdempotencyKey.objects.all(),
        operation="test.refuse",
        title="Refuse",
        explanation="",
        button="Yes",
        decide=refuse,
        done_message=lambda changed, skipped: "done",
    )
    assert response.status_code == 303
    assert response["Location"] == "/admin/idempotency/idempotencykey/"
    assert [str(m) for m in get_messages(request)] == [
        "Already decided: Someone else decided it first."
    ]
