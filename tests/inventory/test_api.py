import pytest
from django.db import IntegrityError, transaction

from inventory.models import Product, StockItem
from tests.conftest import assert_problem

pytestmark = pytest.mark.django_db

NEW = {"sku": "MUG-1", "name": "Mug", "price": "9.50", "currency": "EUR", "stock": 4}


def test_catalog_is_public_and_shows_available(api_client, make_product):
    make_product("TEE-M", price="19.99", stock=5)
    StockItem.objects.filter(product__sku="TEE-M").update(reserved=2)
    response = api_client.get("/api/v1/products/")
    assert response.status_code == 200
    assert response.json() == {
        "results": [
            {"sku": "TEE-M", "name": "TEE-M", "price": "19.99", "currency": "EUR", "available": 3}
        ],
        "next": None,
    }
    detail = api_client.get("/api/v1/products/TEE-M/")
    assert detail.json()["available"] == 3


def test_unknown_sku_is_problem_404(api_client):
    assert_problem(api_client.get("/api/v1/products/NOPE/"), 404, "not_found")


@pytest.mark.parametrize("path", ["/api/v1/products/A%00B/", "/api/v1/products/%00/"])
def test_nul_in_sku_is_404_not_500(api_client, path):
    assert_problem(api_client.get(path), 404, "not_found")


def test_nul_in_sku_of_stock_endpoint_is_404_not_500(staff_client):
    response = staff_client.post(
        "/api/v1/products/%00/stock/", {"delta": 1}, format="json", HTTP_IDEMPOTENCY_KEY="k-nul"
    )
    assert_problem(response, 404, "not_found")


def test_cursor_pagination_walks_every_product_once(api_client, make_product):
    for i in range(7):
        make_product(f"SKU-{i}")
    seen, url = [], "/api/v1/products/?page_size=3"
    while url:
        body = api_client.get(url).json()
        assert len(body["results"]) <= 3
        seen += [p["sku"] for p in body["results"]]
        url = body["next"]
    assert seen == [f"SKU-{i}" for i in range(7)]


def test_page_size_is_capped_at_200(api_client, make_product):
    make_product("A")
    assert api_client.get("/api/v1/products/?page_size=5000").status_code == 200


def test_bad_cursor_is_400(api_client):
    assert_problem(api_client.get("/api/v1/products/?cursor=garbage"), 400, "invalid_request")


def test_staff_creates_product(staff_client):
    response = staff_client.post("/api/v1/products/", NEW, format="json")
    assert response.status_code == 201, response.content
    assert response.json() == {
        "sku": "MUG-1",
        "name": "Mug",
        "price": "9.50",
        "currency": "EUR",
        "available": 4,
    }
    assert StockItem.objects.get(product__sku="MUG-1").on_hand == 4


def test_shopper_may_not_create_product(shopper_client):
    assert_problem(
        shopper_client.post("/api/v1/products/", NEW, format="json"), 403, "permission_denied"
    )


def test_anonymous_may_not_create_product(api_client):
    assert_problem(
        api_client.post("/api/v1/products/", NEW, format="json"), 401, "not_authenticated"
    )


def test_duplicate_sku_is_409(staff_client):
    staff_client.post("/api/v1/products/", NEW, format="json")
    assert_problem(staff_client.post("/api/v1/products/", NEW, format="json"), 409, "sku_exists")
    assert Product.objects.count() == 1


def test_other_currency_is_422(staff_client):
    body = assert_problem(
        staff_client.post("/api/v1/products/", {**NEW, "currency": "USD"}, format="json"),
        422,
        "currency_mismatch",
    )
    assert "currency" in body["errors"]
    assert not Product.objects.exists()


@pytest.mark.parametrize(
    "price",
    [9.5, "9.505", "-1.00", "abc", None],
    ids=["number", "decimals", "negative", "text", "null"],
)
def test_bad_price_is_400(staff_client, price):
    body = assert_problem(
        staff_client.post("/api/v1/products/", {**NEW, "price": price}, format="json"),
        400,
        "invalid_request",
    )
    assert "price" in body["errors"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("sku", 123),
        ("name", 123),
        ("currency", ["EUR"]),
        ("stock", "4"),
        ("stock", 4.0),
        ("stock", True),
        ("colour", "red"),
    ],
)
def test_product_fields_have_strict_json_types(staff_client, field, value):
    body = assert_problem(
        staff_client.post("/api/v1/products/", {**NEW, field: value}, format="json"),
        400,
        "invalid_request",
    )
    assert field in body["errors"]
    assert not Product.objects.exists()


def test_price_non_negative_is_a_database_constraint(db):
    with pytest.raises(IntegrityError) as info, transaction.atomic():
        Product.objects.create(sku="X", name="x", price=-1, currency="EUR")
    assert "inventory_product_price_non_negative" in str(info.value)


def test_stock_reserved_never_exceeds_on_hand(make_product):
    make_product("X", stock=1)
    with pytest.raises(IntegrityError) as info, transaction.atomic():
        StockItem.objects.filter(product__sku="X").update(reserved=2)
    assert "inventory_stock_on_hand_covers_reserved" in str(info.value)
