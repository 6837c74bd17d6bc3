"""Staff ship and cancel from an order's own page: keyed forms, refusals as messages, permissions.

"Create shipment" is the API's keyed shipment run under the admin's own
operation name: a double submit or a second tab of one rendered form ships
once; a refusal (422 exceeds_unshipped) comes back to the form as an admin
message with the problem's title; a staff user who may only view gets 403
and nothing ships.
"""

from __future__ import annotations

import re

import pytest
from celery import current_app
from django.contrib.auth.models import Permission
from django.test import Client

from idempotency.models import IdempotencyKey
from idempotency.views import FORM_REFUSALS
from orders.admin.forms import ADMIN_SHIPMENT_CREATE
from orders.models import Order, Shipment, ShipmentLine
from tests.orders.shipping import confirm
from tests.support.servers import key_hold

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def quiet_bells(monkeypatch):
    monkeypatch.setattr(current_app, "send_task", lambda *a, **kw: None)


@pytest.fixture
def superuser(make_user):
    user = make_user(staff=True)
    user.is_superuser = True
    user.save(update_fields=["is_superuser"])
    return user


def browser_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def admin_browser(superuser):
    return browser_for(superuser)


@pytest.fixture
def viewer(make_user):
    """Staff who may only view orders (and shipments)."""
    user = make_user(staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_order", "view_shipment"])
    )
    return browser_for(user)


@pytest.fixture
def confirmed(make_product, reserve):
    make_product("TEE-M", price="19.99", stock=10)
    make_product("MUG", price="7.50", stock=10)
    return confirm(reserve({"TEE-M": 3, "MUG": 2}))


def ship_url(order) -> str:
    return f"/admin/orders/order/{order.pk}/ship/"


def form_key(page) -> str:
    assert page.status_code == 200, page.status_code
    return re.search(r'name="idempotency_key" value="([^"]+)"', page.content.decode()).group(1)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def test_create_shipment_twice_from_one_form_ships_once(admin_browser, confirmed):
    page = admin_browser.get(ship_url(confirmed))
    assert b"TEE-M" in page.content and b"MUG" in page.content
    key = form_key(page)
    body = {
        "idempotency_key": key,
        "ship-TEE-M": "2",
        "ship-MUG": "0",
        "carrier": "dhl",
        "tracking_number": "TRK-1",
    }
    answers = [admin_browser.post(ship_url(confirmed), body) for _ in range(2)]
    assert [a.status_code for a in answers] == [303, 303]
    assert answers[0]["Location"] == answers[1]["Location"]
    assert answers[1]["Idempotent-Replayed"] == "true"
    (shipment,) = Shipment.objects.filter(order=confirmed)
    assert (shipment.carrier, shipment.tracking_number) == ("dhl", "TRK-1")
    assert list(ShipmentLine.objects.filter(shipment=shipment).values_list("sku", "quantity")) == [
        ("TEE-M", 2)
    ]
    page = admin_browser.get(answers[0]["Location"])
    assert f"Shipment {shipment.pk} created." in messages_of(page)
    assert Order.objects.get(pk=confirmed.pk).fulfillment == "partially_shipped"


def test_a_replay_shows_the_first_answers_message(superuser, confirmed):
    """A double click whose first answer the browser dropped: the replay tells what happened.

    The first submit's session never reads its answer (the browser followed
    the second submit); the second is a replay and its page still says
    "Shipment N created.": the message is stored with the key's answer
    (idempotency.views.form_redirect), not only queued for the first request.
    """
    first, second = browser_for(superuser), browser_for(superuser)
    key = form_key(first.get(ship_url(confirmed)))
    body = {"idempotency_key": key, "ship-TEE-M": "1", "ship-MUG": "0"}
    body |= {"carrier": "", "tracking_number": ""}
    assert first.post(ship_url(confirmed), body).status_code == 303
    replay = second.post(ship_url(confirmed), body)
    assert (replay.status_code, replay["Idempotent-Replayed"], replay.content) == (303, "true", b"")
    (shipment,) = Shipment.objects.filter(order=confirmed)
    assert messages_of(second.get(replay["Location"])) == [f"Shipment {shipment.pk} created."]


def test_a_submit_meeting_its_key_still_running_is_a_409_page_a_reload_resends(
    superuser, admin_browser, confirmed
):
    """The second submit of a double click while the first runs: 409 at the POST's URL.

    The page says the form is being sent and to reload; reloading resends the
    same POST (a replay once the first has finished), so it is not a redirect
    back to the form, whose fresh key would start a second submission.
    """
    key = form_key(admin_browser.get(ship_url(confirmed)))
    fields = {"ship-TEE-M": "1", "ship-MUG": "0", "carrier": "", "tracking_number": ""}
    key_hold(
        owner_id=superuser.pk,
        key=key,
        operation=ADMIN_SHIPMENT_CREATE,
        path=ship_url(confirmed),
        body={name: [value] for name, value in fields.items()},
    )
    answer = admin_browser.post(ship_url(confirmed), {**fields, "idempotency_key": key})
    assert answer.status_code == 409 and int(answer["Retry-After"]) >= 1
    assert str(FORM_REFUSALS["idempotency_key_in_use"]) in answer.content.decode()
    assert not Shipment.objects.filter(order=confirmed).exists()


def test_two_tabs_of_the_same_form_carry_one_key_and_ship_once(admin_browser, confirmed):
    tabs = [form_key(admin_browser.get(ship_url(confirmed))) for _ in range(2)]
    assert tabs[0] == tabs[1]
    body = {"ship-TEE-M": "3", "ship-MUG": "2", "carrier": "", "tracking_number": ""}
    for key in tabs:
        assert (
            admin_browser.post(ship_url(confirmed), {**body, "idempotency_key": key}).status_code
            == 303
        )
    assert Shipment.objects.filter(order=confirmed).count() == 1
    # The state moved: the next form carries a new key.
    assert form_key(admin_browser.get(ship_url(confirmed))) != tabs[0]


def test_a_second_tab_with_other_values_is_told_and_ships_nothing_more(admin_browser, confirmed):
    key = form_key(admin_browser.get(ship_url(confirmed)))
    first = {"idempotency_key": key, "ship-TEE-M": "1", "ship-MUG": "0"}
    assert admin_browser.post(ship_url(confirmed), first).status_code == 303
    other = admin_browser.post(ship_url(confirmed), {**first, "ship-MUG": "1"}, follow=True)
    assert any("already submitted with other values" in m for m in messages_of(other))
    assert Shipment.objects.filter(order=confirmed).count() == 1


def test_more_than_unshipped_is_a_message_with_the_problems_title(admin_browser, confirmed):
    url = ship_url(confirmed)
    key = form_key(admin_browser.get(url))
    answer = admin_browser.post(url, {"idempotency_key": key, "ship-TEE-M": "4", "ship-MUG": "0"})
    assert answer.status_code == 303
    assert answer["Location"].startswith(url)  # back to the form, not the admin index
    page = admin_browser.get(answer["Location"])
    assert any(m.startswith("Exceeds unshipped: ") for m in messages_of(page)), messages_of(page)
    assert form_key(page) != key  # a fresh key for the corrected form
    assert not Shipment.objects.exists()
    # Stored like the API's refusal: the same form sent again is the same answer.
    assert IdempotencyKey.objects.filter(key=key).count() == 1


def test_an_order_cancelled_meanwhile_is_refused_with_a_message(admin_browser, confirmed):
    from orders.services import order_cancel

    key = form_key(admin_browser.get(ship_url(confirmed)))
    order_cancel(order_id=confirmed.id)  # another tab, or the shopper, cancelled it
    body = {"idempotency_key": key, "ship-TEE-M": "1", "ship-MUG": "0"}
    answer = admin_browser.post(ship_url(confirmed), body)
    assert answer.status_code == 303 and answer["Location"].startswith(ship_url(confirmed))
    page = admin_browser.get(answer["Location"])
    assert any(m.startswith("Invalid state: ") for m in messages_of(page)), messages_of(page)
    assert not Shipment.objects.exists()


def test_a_form_with_nothing_to_ship_is_shown_again_and_claims_nothing(admin_browser, confirmed):
    key = form_key(admin_browser.get(ship_url(confirmed)))
    page = admin_browser.post(
        ship_url(confirmed), {"idempotency_key": key, "ship-TEE-M": "0", "ship-MUG": "0"}
    )
    assert page.status_code == 200 and b"Ship at least one unit." in page.content
    assert not IdempotencyKey.objects.filter(key=key).exists()


def test_view_only_staff_get_403_and_nothing_ships(viewer, admin_browser, confirmed):
    key = form_key(admin_browser.get(ship_url(confirmed)))
    assert viewer.get(ship_url(confirmed)).status_code == 403
    answer = viewer.post(ship_url(confirmed), {"idempotency_key": key, "ship-TEE-M": "1"})
    assert answer.status_code == 403
    assert not Shipment.objects.exists()
    page = viewer.get(f"/admin/orders/order/{confirmed.pk}/change/")
    assert page.status_code == 200
    assert b"create-shipment" not in page.content and b"cancel-order" not in page.content


def test_the_order_page_has_its_buttons(admin_browser, confirmed):
    page = admin_browser.get(f"/admin/orders/order/{confirmed.pk}/change/").content.decode()
    assert f"/admin/orders/order/{confirmed.pk}/ship/" in page
    assert f"/admin/orders/order/{confirmed.pk}/cancel-order/" in page


# --- Cancel order on the order's page -----------------------------------------------


def cancel_url(order) -> str:
    return f"/admin/orders/order/{order.pk}/cancel-order/"


def test_cancel_page_says_what_happens_and_two_tabs_cancel_once(admin_browser, confirmed):
    pages = [admin_browser.get(cancel_url(confirmed)) for _ in range(2)]
    assert b"moves to cancelling" in pages[0].content
    keys = [form_key(page) for page in pages]
    assert keys[0] == keys[1]
    answers = [admin_browser.post(cancel_url(confirmed), {"idempotency_key": k}) for k in keys]
    assert [a.status_code for a in answers] == [303, 303]
    assert answers[1]["Idempotent-Replayed"] == "true"
    order = Order.objects.get(pk=confirmed.pk)
    assert order.status == "cancelling"
    assert order.compensation_steps.count() > 0
    assert order.events.filter(kind="cancellation_started").count() == 1


def test_cancel_refused_comes_back_to_the_order_page_with_a_message(admin_browser, confirmed):
    from tests.orders.shipping import ship

    key = form_key(admin_browser.get(cancel_url(confirmed)))
    ship(confirmed, {"TEE-M": 1})
    answer = admin_browser.post(cancel_url(confirmed), {"idempotency_key": key})
    assert answer.status_code == 303
    assert answer["Location"] == f"/admin/orders/order/{confirmed.pk}/change/"
    page = admin_browser.get(answer["Location"])
    assert any(m.startswith("Order shipped: ") for m in messages_of(page)), messages_of(page)
    assert Order.objects.get(pk=confirmed.pk).status == "confirmed"


def test_view_only_staff_cannot_cancel(viewer, admin_browser, confirmed):
    key = form_key(admin_browser.get(cancel_url(confirmed)))
    assert viewer.get(cancel_url(confirmed)).status_code == 403
    assert viewer.post(cancel_url(confirmed), {"idempotency_key": key}).status_code == 403
    assert Order.objects.get(pk=confirmed.pk).status == "confirmed"


@pytest.mark.django_db(transaction=True)
def test_the_admin_form_and_the_api_racing_for_the_same_units_ship_once(
    admin_browser, confirmed, make_user, client_for
):
    """Both inside `shipment_create` at once (the first holds the order's lock until the other
    queues on it): one ships, the other is refused (a message / 422); never 4 of 2 units."""
    import threading

    from django.db import connection

    from idempotency import failpoints
    from tests.concurrency import Workers, wait_for_lock_waiters

    key = form_key(admin_browser.get(ship_url(confirmed)))
    api = client_for(make_user(actions=True))
    barrier = threading.Barrier(2)
    first_in = threading.Event()

    def hold_first(_name):
        if not first_in.is_set():
            first_in.set()
            wait_for_lock_waiters(1)  # the overlap is proved, not hoped for

    def admin_form():
        barrier.wait(timeout=10)
        try:
            body = {"idempotency_key": key, "ship-MUG": "2", "ship-TEE-M": "0"}
            answer = admin_browser.post(ship_url(confirmed), body)
            return ("admin", answer.status_code, answer["Location"])
        finally:
            connection.close()

    def api_call():
        barrier.wait(timeout=10)
        try:
            answer = api.post(
                f"/api/v1/orders/{confirmed.id}/shipments/",
                {"lines": [{"sku": "MUG", "quantity": 2}]},
                format="json",
                HTTP_IDEMPOTENCY_KEY="api-race",
            )
            return ("api", answer.status_code, "")
        finally:
            connection.close()

    with failpoints.hook("shipment.create.locked", hold_first):
        workers = Workers()
        workers.start(admin_form)
        workers.start(api_call)
        outcomes = dict((who, (status, where)) for who, status, where in workers.join())
    assert first_in.is_set()
    assert outcomes["admin"][0] == 303
    admin_shipped = outcomes["admin"][1] == f"/admin/orders/order/{confirmed.pk}/change/"
    assert outcomes["api"][0] == (422 if admin_shipped else 201), outcomes
    assert Shipment.objects.filter(order=confirmed).count() == 1
    assert confirmed.lines.get(sku="MUG").quantity_shipped == 2


def test_a_refused_refund_is_a_message_with_the_title(admin_browser, confirmed):
    """The admin refund form's refusal (no payment here: 409) is an admin message with its title."""
    url = f"/admin/orders/order/{confirmed.pk}/refund/"
    key = form_key(admin_browser.get(url))
    answer = admin_browser.post(url, {"amount": "5.00", "reason": "x", "idempotency_key": key})
    assert answer.status_code == 303 and answer["Location"].startswith(url)
    page = admin_browser.get(answer["Location"])
    assert messages_of(page) == ["Invalid state: Nothing to refund: the order has no payment."]
