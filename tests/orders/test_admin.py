"""Staff see orders, their lines, events and reservation flags in the admin, read-only."""

import pytest
from django.contrib.auth.models import Permission

from orders.models import Order
from orders.services import order_payment_start

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/orders/order/"


def change_page(order: Order) -> str:
    return f"{CHANGELIST}{order.pk}/change/"


@pytest.fixture
def staff_browser(client, make_user):
    """A superuser's browser session, as `createsuperuser` makes staff."""
    staff = make_user(staff=True)
    staff.is_superuser = True
    staff.save()
    client.force_login(staff)
    return client


@pytest.fixture
def placed(make_product, make_user, reserve):
    make_product("TEE-M", price="19.99", stock=50)
    make_product("MUG", price="7.50", stock=1)
    alice = make_user(username="alice")
    # Short on MUG, so the shopper is asked: lines reserved, flags expiring.
    asked = reserve({"TEE-M": 2, "MUG": 3}, on_shortage="ask", owner=alice)
    other = order_payment_start(order=reserve({"TEE-M": 1}, owner=make_user(username="bob")))
    return asked, other


def test_changelist_lists_orders(staff_browser, placed):
    asked, other = placed
    response = staff_browser.get(CHANGELIST)
    assert response.status_code == 200
    page = response.content.decode()
    for order in placed:
        assert str(order.number) in page
    assert "alice" in page and "awaiting_decision" in page


def test_change_page_shows_lines_events_flags_and_payment(staff_browser, placed):
    asked, _ = placed
    response = staff_browser.get(change_page(asked))
    assert response.status_code == 200
    page = response.content.decode()
    assert "TEE-M" in page and "MUG" in page  # the lines
    assert asked.events.count() > 0
    for event in asked.events.all():
        assert event.kind in page  # the events
    reservation = asked.lines.get(sku="MUG").reservation
    assert f"/admin/inventory/reservation/{reservation.pk}/change/" in page  # the flag
    assert "Held" in page  # the flag state, as its label
    assert "payment status" in page.lower()


@pytest.mark.parametrize(
    ("query", "expected"),
    [("number", {"asked"}), ("alice", {"asked"}), ("bob@example.com", {"other"})],
)
def test_search_by_number_username_or_email(staff_browser, placed, query, expected):
    orders = dict(zip(["asked", "other"], placed, strict=True))
    term = str(orders["asked"].number) if query == "number" else query
    response = staff_browser.get(CHANGELIST, {"q": term})
    assert response.status_code == 200
    shown = {o.pk for o in response.context["cl"].result_list}
    assert shown == {orders[name].pk for name in expected}


def test_search_by_a_word_is_not_an_error(staff_browser, placed):
    # `=number` on an integer column: a word matches no number (and no 500).
    response = staff_browser.get(CHANGELIST, {"q": "nobody-here"})
    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == []


def test_filters_on_status_and_fulfillment(staff_browser, placed):
    asked, _ = placed
    response = staff_browser.get(CHANGELIST, {"status__exact": "awaiting_decision"})
    assert [o.pk for o in response.context["cl"].result_list] == [asked.pk]
    response = staff_browser.get(CHANGELIST, {"fulfillment__exact": "unfulfilled"})
    assert len(response.context["cl"].result_list) == 2
    assert (
        staff_browser.get(CHANGELIST, {"created_at__gte": "2000-01-01 00:00:00+00:00"}).status_code
        == 200
    )


def test_admin_refuses_add_change_and_delete(staff_browser, placed):
    asked, _ = placed
    before = Order.objects.values().get(pk=asked.pk)
    assert staff_browser.get(f"{CHANGELIST}add/").status_code == 403
    assert staff_browser.post(f"{CHANGELIST}add/", {"status": "confirmed"}).status_code == 403
    posted = staff_browser.post(change_page(asked), {"status": "confirmed", "total": "0.00"})
    assert posted.status_code == 403
    assert staff_browser.get(f"{CHANGELIST}{asked.pk}/delete/").status_code == 403
    assert staff_browser.post(f"{CHANGELIST}{asked.pk}/delete/", {"post": "yes"}).status_code == 403
    bulk = staff_browser.post(
        CHANGELIST, {"action": "delete_selected", "_selected_action": [asked.pk], "post": "yes"}
    )
    assert bulk.status_code == 403  # an action not offered (delete): refused, nothing happens
    assert Order.objects.values().get(pk=asked.pk) == before
    assert b"delete_selected" not in staff_browser.get(CHANGELIST).content


def test_staff_with_view_permission_only_can_read(client, make_user, placed):
    staff = make_user(staff=True)
    staff.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_order", "view_orderline", "view_orderevent"])
    )
    client.force_login(staff)
    assert client.get(CHANGELIST).status_code == 200
    assert client.get(change_page(placed[0])).status_code == 200
    assert client.post(change_page(placed[0]), {"status": "confirmed"}).status_code == 403


@pytest.mark.parametrize("url", [CHANGELIST, "change"])
def test_non_staff_is_sent_to_log_in(client, make_user, placed, url):
    client.force_login(make_user())
    path = change_page(placed[0]) if url == "change" else url
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    anonymous = client.__class__()
    assert anonymous.get(path)["Location"].startswith("/admin/login/")


def test_changelist_queries_are_bounded(
    staff_browser, make_product, make_user, reserve, django_assert_max_num_queries
):
    make_product("TEE-M", price="19.99", stock=100)
    owners = [make_user() for _ in range(5)]
    for i in range(30):
        # Every order with a payment, so the payment column has rows to join.
        order_payment_start(order=reserve({"TEE-M": 1}, owner=owners[i % 5]))
    # Session, user, the page with owners and payments joined (4 in all):
    # the same for 30 orders as for 3; without the joins it is 64.
    with django_assert_max_num_queries(10):
        response = staff_browser.get(CHANGELIST)
    assert response.status_code == 200
    assert len(response.context["cl"].result_list) == 30


def test_change_page_queries_are_bounded(staff_browser, placed, django_assert_max_num_queries):
    # The lines come with their flags, the events with their lines (no query per row).
    with django_assert_max_num_queries(12):
        assert staff_browser.get(change_page(placed[0])).status_code == 200


def test_change_page_shows_the_payment(staff_browser, placed):
    _, other = placed
    page = staff_browser.get(change_page(other)).content.decode()
    assert f"order-{other.number}" in page
    assert f"/admin/payments/payment/{other.payment_id}/change/" in page


def test_reservation_page_links_back_to_its_order(staff_browser, placed):
    asked, _ = placed
    flag = asked.lines.get(sku="MUG").reservation
    page = staff_browser.get(f"/admin/inventory/reservation/{flag.pk}/change/")
    assert page.status_code == 200
    assert f'href="{change_page(asked)}"' in page.content.decode()
    found = staff_browser.get("/admin/inventory/reservation/", {"q": str(asked.number)})
    assert {r.pk for r in found.context["cl"].result_list} == {
        line.reservation_id for line in asked.lines.all()
    }
