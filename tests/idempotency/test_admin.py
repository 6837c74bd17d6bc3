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
