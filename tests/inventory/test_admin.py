"""Staff see stock counters and reservation flags in the admin, read-only."""

import pytest

from inventory.models import Reservation, StockItem
from inventory.services import reservations_hold

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_browser(client, make_user):
    staff = make_user(staff=True)
    staff.is_superuser = True
    staff.save()
    client.force_login(staff)
    return client


@pytest.fixture
def held(make_product):
    make_product("TEE-M", stock=5)
    make_product("MUG", stock=2)
    stock = StockItem.objects.get(product__sku="TEE-M")
    return reservations_hold(requests={stock.id: 2}, partial=False)[stock.id]


def test_stock_list_shows_counters(staff_browser, held):
    response = staff_browser.get("/admin/inventory/stockitem/")
    assert response.status_code == 200
    rows = {s.product.sku: (s.on_hand, s.reserved) for s in response.context["cl"].result_list}
    assert rows == {"TEE-M": (5, 2), "MUG": (2, 0)}
    found = staff_browser.get("/admin/inventory/stockitem/", {"q": "MUG"})
    assert [s.product.sku for s in found.context["cl"].result_list] == ["MUG"]


def test_reservation_list_and_page(staff_browser, held):
    response = staff_browser.get("/admin/inventory/reservation/", {"state__exact": "held"})
    assert response.status_code == 200
    assert [r.pk for r in response.context["cl"].result_list] == [held.pk]
    page = staff_browser.get(f"/admin/inventory/reservation/{held.pk}/change/")
    assert page.status_code == 200 and "TEE-M" in page.content.decode()


@pytest.mark.parametrize("model", ["stockitem", "reservation"])
def test_stock_and_flags_are_read_only(staff_browser, held, model):
    obj = StockItem.objects.get(product__sku="TEE-M") if model == "stockitem" else held
    base = f"/admin/inventory/{model}/"
    assert staff_browser.get(f"{base}add/").status_code == 403
    changed = staff_browser.post(f"{base}{obj.pk}/change/", {"on_hand": 99, "state": "released"})
    assert changed.status_code == 403
    assert staff_browser.post(f"{base}{obj.pk}/delete/", {"post": "yes"}).status_code == 403
    assert StockItem.objects.get(product__sku="TEE-M").reserved == 2
    assert Reservation.objects.get().state == "held"


def test_lists_join_what_they_show(staff_browser, make_product, django_assert_max_num_queries):
    for i in range(30):
        make_product(f"SKU-{i}", stock=3)
    stocks = StockItem.objects.values_list("id", flat=True)
    reservations_hold(requests={stock_id: 1 for stock_id in stocks}, partial=False)
    for path in ("/admin/inventory/stockitem/", "/admin/inventory/reservation/"):
        with django_assert_max_num_queries(10):
            response = staff_browser.get(path)
        assert len(response.context["cl"].result_list) == 30


def test_non_staff_is_sent_to_log_in(client, make_user, held):
    client.force_login(make_user())
    response = client.get("/admin/inventory/reservation/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
