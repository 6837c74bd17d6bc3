"""The admin's "Needs attention" page: every kind listed with what it belongs to, its reason,
its age and the keyed actions that end it; each action requires its model permission."""

from __future__ import annotations

import datetime
import re

import pytest
from django.db.models.functions import Now
from django.test import Client

from backoffice import needs_attention
from idempotency.models import Delivery
from orders.models import CompensationStep
from payments import refund_decisions
from payments.errors import RefundInvalidState
from payments.models import Payment, PaymentEvent, PaymentSettlement, Refund
from tests.backoffice.attention_support import VIEW_ALL, every_kind, grant

pytestmark = pytest.mark.django_db

PAGE = "/admin/needs-attention/"


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def superuser(make_user):
    user = make_user(staff=True, username="boss")
    user.is_superuser = True
    user.save()
    return user


@pytest.fixture
def items(shopper):
    return every_kind(shopper)


def forms(page) -> list[dict]:
    """Every action form on the page: {kind, pk, action, idempotency_key}."""
    found = []
    for body in re.findall(r"<form method=\"post\".*?</form>", page.content.decode(), re.S):
        fields = dict(re.findall(r'name="(\w+)" value="([^"]*)"', body))
        fields.pop("csrfmiddlewaretoken", None)
        found.append(fields)
    return found


def form_for(page, kind: str, action: str) -> dict:
    return next(f for f in forms(page) if f["kind"] == kind and f["action"] == action)


def test_the_page_lists_every_kind_with_its_order_reason_age_and_actions(superuser, items):
    order = items["order"]
    # Age by the database clock: the refund was flagged two hours ago.
    Refund.objects.filter(id=items["refund"].id).update(
        updated_at=Now() - datetime.timedelta(hours=2, minutes=5)
    )
    page = login(superuser).get(PAGE)
    assert page.status_code == 200
    html = page.content.decode()
    for kind in ("settlement", "refund", "step", "dead_letter"):
        assert f'data-kind="{kind}"' in html
    assert html.count(f"order {order.number}</a>") == 4  # each names its order
    for reason in (
        "provider timed out",
        "card_closed",
        "SMTP refused",
        "poison: unknown shopper",
    ):
        assert reason in html
    assert "2 h 5 min" in html
    offered = {(f["kind"], f["action"]) for f in forms(page)}
    assert offered == {
        ("settlement", "retry"),
        ("refund", "retry"),
        ("refund", "outside"),
        ("refund", "failed"),
        ("step", "retry"),
        ("dead_letter", "requeue"),
    }
    assert '<strong id="needs-attention-total">4</strong>' in html


def test_the_index_links_the_page_with_its_count(superuser, items):
    page = login(superuser).get("/admin/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f'href="{PAGE}"' in html
    assert re.search(r'class="needs-attention-count">4<', html)


def test_a_return_refund_names_its_return(superuser, items):
    step = items["step"]
    # The refund a return's refund step asked for: the step names the refund id.
    from orders.models import ReturnRequest

    order_return = ReturnRequest.objects.create(
        order=items["order"],
        status="needs_attention",
        reason="too big",
        currency="EUR",
        refund_amount="5.00",
        received_at=Now(),
    )
    CompensationStep.objects.create(
        kind="return",
        order=items["order"],
        order_return=order_return,
        name="refund",
        position=2,
        status="running",
        refund_id=items["refund"].id,
    )
    html = login(superuser).get(PAGE).content.decode()
    assert f"/admin/orders/returnrequest/{order_return.id}/change/" in html
    assert step.pk  # the cancellation step is listed too (no return)


@pytest.mark.parametrize(
    ("kind", "action"),
    [
        ("settlement", "retry"),
        ("refund", "retry"),
        ("refund", "outside"),
        ("refund", "failed"),
        ("step", "retry"),
        ("dead_letter", "requeue"),
    ],
)
def test_each_action_ends_its_item_once_for_a_double_click_and_two_tabs(
    superuser, items, kind, action
):
    client = login(superuser)
    tab_1, tab_2 = client.get(PAGE), client.get(PAGE)
    form = form_for(tab_1, kind, action)
    assert form == form_for(tab_2, kind, action)  # the same state: the same key
    events_before = PaymentEvent.objects.count()
    answers = [client.post(PAGE, form) for _ in range(3)]  # double click, second tab
    assert {a.status_code for a in answers} == {303}
    assert len({a["Location"] for a in answers}) == 1
    assert [a.get("Idempotent-Replayed") for a in answers] == [None, "true", "true"]
    shown = client.get(answers[0]["Location"])
    assert f"{needs_attention.action_for(kind, action).label}: done." in shown.content.decode()
    listed = f'data-kind="{kind}" data-pk="{form["pk"]}"'
    assert listed not in shown.content.decode()  # the item has ended
    if kind in ("settlement", "refund"):
        assert PaymentEvent.objects.count() == events_before + 1  # one retry / decision
    rows = {
        "settlement": PaymentSettlement.objects.filter(needs_attention=True),
        "refund": Refund.objects.filter(status="needs_attention"),
        "step": CompensationStep.objects.filter(status="failed"),
        "dead_letter": Delivery.objects.filter(needs_attention=True),
    }
    assert not rows[kind].exists()


def test_two_decisions_from_two_tabs_change_the_refund_once(superuser, items):
    client = login(superuser)
    page = client.get(PAGE)
    outside, failed = form_for(page, "refund", "outside"), form_for(page, "refund", "failed")
    assert client.post(PAGE, outside).status_code == 303
    second = client.post(PAGE, failed)  # the other tab: another key, the transition decides
    assert second.status_code == 303
    assert "nothing changed" in client.get(second["Location"]).content.decode()
    refund = Refund.objects.get(id=items["refund"].id)
    assert (refund.status, refund.outside_shop) == ("succeeded", True)
    payment = Payment.objects.get(id=items["payment"].id)
    assert (payment.amount_refunded, payment.refund_reserved) == (refund.amount, refund.amount)


def test_a_refusal_is_an_admin_message_with_its_title(superuser, items, monkeypatch):
    def refuse(**kwargs):
        raise RefundInvalidState("A refund a return owns: use Retry step.")

    monkeypatch.setattr(refund_decisions, "refund_record_failed", refuse)
    client = login(superuser)
    answer = client.post(PAGE, form_for(client.get(PAGE), "refund", "failed"))
    assert answer.status_code == 303 and answer["Location"].startswith(PAGE)
    shown = client.get(answer["Location"]).content.decode()
    assert 'class="error"' in shown
    assert "Invalid state: A refund a return owns: use Retry step." in shown
    assert Refund.objects.get(id=items["refund"].id).status == "needs_attention"


def test_view_only_staff_see_the_items_but_no_action_and_a_forced_post_is_403(
    make_user, superuser, items
):
    form = form_for(login(superuser).get(PAGE), "refund", "outside")
    viewer = make_user(staff=True, username="viewer")
    grant(viewer, *VIEW_ALL)
    client = login(viewer)
    page = client.get(PAGE)
    assert page.status_code == 200 and 'data-kind="refund"' in page.content.decode()
    assert forms(page) == []
    assert "No action you may take" in page.content.decode()
    before = Refund.objects.values().get(id=items["refund"].id)
    for kind, action in [(f["kind"], f["action"]) for f in forms(login(superuser).get(PAGE))]:
        forced = client.post(PAGE, {**form_for(login(superuser).get(PAGE), kind, action)})
        assert forced.status_code == 403, (kind, action)
    assert Refund.objects.values().get(id=items["refund"].id) == before
    assert PaymentSettlement.objects.get(id=items["settlement"].id).needs_attention
    assert CompensationStep.objects.get(id=items["step"].id).status == "failed"
    assert Delivery.objects.get(id=items["dead_letter"].id).needs_attention
    assert client.post(PAGE, form).status_code == 403


@pytest.mark.parametrize(
    ("kind", "action", "permission"),
    [
        ("settlement", "retry", "payments.change_paymentsettlement"),
        ("refund", "outside", "payments.change_refund"),
        ("step", "retry", "orders.change_compensationstep"),
        ("dead_letter", "requeue", "idempotency.change_deadletter"),
    ],
)
def test_staff_with_the_model_permission_can_take_the_action(
    make_user, superuser, items, kind, action, permission
):
    user = make_user(staff=True, username="clerk")
    grant(user, *VIEW_ALL, permission)
    client = login(user)
    page = client.get(PAGE)
    assert {(f["kind"], f["action"]) for f in forms(page)} >= {(kind, action)}
    answer = client.post(PAGE, form_for(page, kind, action))
    assert answer.status_code == 303
    assert "done." in client.get(answer["Location"]).content.decode()


def test_a_kind_the_user_may_not_view_is_not_listed_nor_counted(make_user, items):
    user = make_user(staff=True, username="payments-clerk")
    grant(user, "payments.view_refund")
    client = login(user)
    html = client.get(PAGE).content.decode()
    assert 'data-kind="refund"' in html
    assert 'data-kind="step"' not in html and 'data-kind="dead_letter"' not in html
    assert re.search(r'class="needs-attention-count">1<', client.get("/admin/").content.decode())


@pytest.mark.parametrize(
    "body",
    [
        {"kind": "refund", "pk": "not-a-uuid", "action": "outside", "idempotency_key": "k"},
        {"kind": "nope", "pk": "1", "action": "retry", "idempotency_key": "k"},
        {"kind": "step", "pk": "1", "action": "explode", "idempotency_key": "k"},
        {"kind": "step", "pk": "1", "action": "retry"},
    ],
)
def test_bad_input_is_400_and_changes_nothing(superuser, items, body):
    assert login(superuser).post(PAGE, body).status_code == 400
    assert CompensationStep.objects.get(id=items["step"].id).status == "failed"


@pytest.mark.parametrize(
    ("kind", "action", "pk"),
    [
        ("settlement", "retry", "999999"),
        ("refund", "outside", "00000000-0000-0000-0000-000000000000"),
        ("step", "retry", "999999"),
        ("dead_letter", "requeue", "999999"),
    ],
)
def test_an_action_on_a_row_that_does_not_exist_changes_nothing(superuser, kind, action, pk):
    client = login(superuser)
    body = {"kind": kind, "pk": pk, "action": action, "idempotency_key": f"k-{kind}"}
    answer = client.post(PAGE, body)
    assert answer.status_code == 303
    assert "nothing changed" in client.get(answer["Location"]).content.decode()


def test_the_page_needs_staff(client, shopper, items):
    client.force_login(shopper)
    assert client.get(PAGE).status_code == 302  # to the admin's log-in
    assert client.post(PAGE, {}).status_code == 302


def test_age_text():
    assert needs_attention.age_text(datetime.timedelta(seconds=12)) == "12 s"
    assert needs_attention.age_text(datetime.timedelta(minutes=4, seconds=5)) == "4 min 5 s"
    assert needs_attention.age_text(datetime.timedelta(days=2, hours=3, minutes=1)) == "2 d 3 h"
    assert needs_attention.age_text(datetime.timedelta(seconds=-3)) == "0 s"


def test_counts_cover_every_kind(items):
    assert needs_attention.needs_attention_counts() == {
        "settlement": 1,
        "refund": 1,
        "step": 1,
        "dead_letter": 1,
        "report_day": 0,
    }


def test_a_refund_flagged_by_the_providers_late_refund_is_listed_with_its_action(superuser, items):
    # A refund staff recorded outside the shop that the provider then reported too
    # (flagged with its reason, status succeeded): listed, decided on its own page.
    Refund.objects.filter(id=items["refund"].id).update(
        status="succeeded",
        needs_attention=True,
        last_error="the provider reports a refund that was recorded as outside the shop",
    )
    page = login(superuser).get(PAGE)
    html = page.content.decode()
    assert "recorded as outside the shop" in html
    # Its one way out here: "Accept the provider's refund" (payments.refund_decisions).
    assert [f["action"] for f in forms(page) if f["kind"] == "refund"] == ["accept_provider"]
