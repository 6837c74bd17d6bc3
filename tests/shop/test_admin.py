"""The admin shows the shopper mails read-only; "Retry now" reopens one that needs attention."""

import pytest

from shop.models import Mail

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def superuser_client(client, make_user):
    staff = make_user(staff=True)
    staff.is_superuser = True
    staff.save()
    client.force_login(staff)
    return client


def flagged_mail() -> Mail:
    return Mail.objects.create(
        message_id="m-admin",
        event_type="order.confirmed",
        payload={"number": 7},
        address="shopper@example.com",
        attempts=10,
        needs_attention=True,
        last_error="not sent after 10 attempts",
    )


def test_the_mails_are_listed_read_only(superuser_client):
    row = flagged_mail()
    listed = superuser_client.get("/admin/shop/mail/?needs_attention__exact=1")
    assert listed.status_code == 200 and "shopper@example.com" in listed.content.decode()
    assert superuser_client.get(f"/admin/shop/mail/{row.pk}/change/").status_code == 200
    assert superuser_client.get("/admin/shop/mail/add/").status_code == 403
    assert superuser_client.post(f"/admin/shop/mail/{row.pk}/delete/").status_code == 403


def test_retry_now_gives_a_mail_that_needs_attention_a_fresh_budget_and_rings(
    superuser_client, monkeypatch
):
    rang = []
    monkeypatch.setattr(
        "core.due.doorbell.ring", lambda model, pk, delay=0.0, **_: rang.append((model, pk))
    )
    row = flagged_mail()
    answer = superuser_client.post(
        "/admin/shop/mail/", {"action": "retry_now", "_selected_action": [row.pk]}
    )
    assert answer.status_code == 302
    row.refresh_from_db()
    assert not row.needs_attention and row.attempts == 0 and row.done_at is None
    assert rang == [(Mail, row.pk)]
