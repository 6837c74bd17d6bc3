import pytest

from tests.conftest import assert_problem

pytestmark = pytest.mark.django_db


@pytest.fixture
def placed(make_product, make_user, client_for, reserve):
    make_product("TEE-M", price="19.99", stock=10)
    alice, bob = make_user(), make_user()
    orders = [reserve({"TEE-M": 1}, owner=alice) for _ in range(3)]
    return client_for(alice), client_for(bob), orders


def test_list_shows_own_orders_newest_first(placed):
    alice, bob, orders = placed
    response = alice.get("/api/v1/orders/")
    assert response.status_code == 200
    data = response.json()
    assert [o["id"] for o in data["results"]] == [str(o.id) for o in reversed(orders)]
    assert data["next"] is None
    assert bob.get("/api/v1/orders/").json() == {"results": [], "next": None}


def test_list_paginates_by_cursor(placed):
    alice, _, orders = placed
    first = alice.get("/api/v1/orders/?page_size=2").json()
    assert len(first["results"]) == 2 and first["next"]
    second = alice.get(first["next"]).json()
    assert [o["number"] for o in second["results"]] == [orders[0].number]


def test_detail_for_owner_and_staff_404_for_others(placed, staff_client):
    alice, bob, orders = placed
    url = f"/api/v1/orders/{orders[0].id}/"
    body = alice.get(url).json()
    assert body["id"] == str(orders[0].id) and body["status"] == "payment_pending"
    assert staff_client.get(url).status_code == 200
    assert_problem(bob.get(url), 404, "not_found")
    assert_problem(alice.get("/api/v1/orders/nope/"), 404, "not_found")


def test_anonymous_is_401(api_client, placed):
    assert_problem(api_client.get("/api/v1/orders/"), 401, "not_authenticated")
    assert_problem(api_client.get(f"/api/v1/orders/{placed[2][0].id}/"), 401, "not_authenticated")


def test_courier_may_not_use_orders(placed, make_user, client_for):
    """Couriers may only post tracking events: every order endpoint is 403 for them."""
    courier = client_for(make_user(courier=True))
    order = placed[2][0]
    assert_problem(courier.get("/api/v1/orders/"), 403, "permission_denied")
    assert_problem(courier.get(f"/api/v1/orders/{order.id}/"), 403, "permission_denied")
    body = {
        "lines": [{"sku": "TEE-M", "quantity": 1}],
        "payment_method": "pm_card_ok",
        "shipping_address": {
            "name": "C",
            "line1": "L",
            "city": "X",
            "postal_code": "1",
            "country": "DE",
        },
    }
    placing = courier.post("/api/v1/orders/", body, format="json", HTTP_IDEMPOTENCY_KEY="c-1")
    assert_problem(placing, 403, "permission_denied")
    for action in ("confirm", "cancel"):
        response = courier.post(
            f"/api/v1/orders/{order.id}/{action}/", HTTP_IDEMPOTENCY_KEY=f"c-{action}"
        )
        assert_problem(response, 403, "permission_denied")
    from idempotency.models import IdempotencyKey

    assert not IdempotencyKey.objects.filter(owner_id=courier.user.pk).exists()


def test_courier_who_is_staff_reads_orders(placed, make_user, client_for):
    both = client_for(make_user(staff=True, courier=True))
    assert both.get(f"/api/v1/orders/{placed[2][0].id}/").status_code == 200


def test_schema_declares_the_order_endpoints_and_their_keys(api_client):
    paths = api_client.get("/api/schema/", HTTP_ACCEPT="application/json").json()["paths"]
    keyed = [
        ("/api/v1/orders/", "post"),
        ("/api/v1/orders/{order_id}/confirm/", "post"),
        ("/api/v1/orders/{order_id}/cancel/", "post"),
        ("/api/v1/products/{sku}/stock/", "post"),
    ]
    for path, method in keyed:
        headers = [p for p in paths[path][method]["parameters"] if p["in"] == "header"]
        assert headers == [{**headers[0], "name": "Idempotency-Key", "required": True}], (
            path,
            headers,
        )
    assert "get" in paths["/api/v1/orders/"] and "get" in paths["/api/v1/orders/{order_id}/"]
