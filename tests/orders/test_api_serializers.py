from decimal import Decimal

import pytest

from core.money import CurrencyMismatch
from orders.api.serializers import OrderIn, order_body
from tests.orders.conftest import ADDRESS

pytestmark = pytest.mark.django_db


@pytest.fixture
def catalog(make_product):
    make_product("TEE-M", price="19.99", stock=5)
    make_product("MUG", price="7.50", stock=2)


def body(**overrides):
    data = {
        "lines": [{"sku": "TEE-M", "quantity": 2}, {"sku": "MUG", "quantity": 1}],
        "on_shortage": "partial",
        "payment_method": "pm_card_ok",
        "shipping_address": dict(ADDRESS),
    }
    data.update(overrides)
    return data


def errors_of(data) -> dict:
    serializer = OrderIn(data=data)
    assert not serializer.is_valid()
    return serializer.errors


def test_valid_body_resolves_products(catalog):
    serializer = OrderIn(data=body(expected_total="47.48", currency="EUR"))
    assert serializer.is_valid(), serializer.errors
    data = serializer.validated_data
    assert [(line.product.sku, line.quantity) for line in data["lines"]] == [
        ("TEE-M", 2),
        ("MUG", 1),
    ]
    assert data["lines"][0].product.stock.on_hand == 5
    assert data["expected_total"] == Decimal("47.48")
    assert data["on_shortage"] == "partial" and "currency" not in data


def test_on_shortage_defaults_to_reject(catalog):
    data = body()
    del data["on_shortage"]
    serializer = OrderIn(data=data)
    assert serializer.is_valid(), serializer.errors
    assert serializer.validated_data["on_shortage"] == "reject"


def test_country_is_normalised(catalog):
    serializer = OrderIn(data=body(shipping_address={**ADDRESS, "country": "gb"}))
    assert serializer.is_valid(), serializer.errors
    assert serializer.validated_data["shipping_address"]["country"] == "GB"


@pytest.mark.parametrize("quantity", [0, 1001, -1, "2", 2.0, 2.5, True, None], ids=repr)
def test_quantity_must_be_an_integer_from_1_to_1000(catalog, quantity):
    errors = errors_of(body(lines=[{"sku": "TEE-M", "quantity": quantity}]))
    assert "quantity" in errors["lines"][0]


@pytest.mark.parametrize("lines", [[], {}, "TEE-M", None, [1], [{"sku": "TEE-M"}]], ids=repr)
def test_lines_must_be_a_non_empty_list_of_lines(catalog, lines):
    assert "lines" in errors_of(body(lines=lines))


def test_unknown_sku_is_refused_per_line(catalog):
    errors = errors_of(
        body(lines=[{"sku": "TEE-M", "quantity": 1}, {"sku": "NOPE", "quantity": 1}])
    )
    assert errors["lines"] == {1: {"sku": ["Unknown sku."]}}


def test_repeated_sku_is_refused(catalog):
    errors = errors_of(body(lines=[{"sku": "MUG", "quantity": 1}, {"sku": "MUG", "quantity": 2}]))
    assert errors["lines"] == {1: {"sku": ["This sku appears more than once."]}}


def test_too_many_lines(catalog):
    assert "lines" in errors_of(body(lines=[{"sku": "TEE-M", "quantity": 1}] * 101))


@pytest.mark.parametrize("value", ["never", "", None, 1], ids=repr)
def test_bad_on_shortage(catalog, value):
    assert "on_shortage" in errors_of(body(on_shortage=value))


@pytest.mark.parametrize("method", ["pm_card_stolen", "", None, 4], ids=repr)
def test_unknown_payment_method(catalog, method):
    assert "payment_method" in errors_of(body(payment_method=method))


@pytest.mark.parametrize(
    "address",
    [
        None,
        "1 Analytical Way, London",
        [],
        {k: v for k, v in ADDRESS.items() if k != "city"},
        {**ADDRESS, "name": ""},
        {**ADDRESS, "postal_code": 12345},
        {**ADDRESS, "country": "GBR"},
        {**ADDRESS, "planet": "Earth"},
    ],
    ids=["null", "string", "list", "missing", "blank", "number", "country", "unknown"],
)
def test_missing_or_malformed_address(catalog, address):
    assert "shipping_address" in errors_of(body(shipping_address=address))


def test_missing_address(catalog):
    data = body()
    del data["shipping_address"]
    assert "shipping_address" in errors_of(data)


@pytest.mark.parametrize("total", [47.48, "47.485", "abc"], ids=repr)
def test_expected_total_is_a_money_string(catalog, total):
    assert "expected_total" in errors_of(body(expected_total=total))


def test_other_currency_is_422(catalog):
    with pytest.raises(CurrencyMismatch):
        OrderIn(data=body(currency="USD")).is_valid()


def test_unknown_members_are_refused(catalog):
    assert errors_of(body(coupon="FREE")) == {"coupon": ["Unknown field."]}
    errors = errors_of(body(lines=[{"sku": "MUG", "quantity": 1, "gift": True}]))
    assert errors["lines"] == {0: {"gift": ["Unknown field."]}}


def test_body_must_be_an_object(catalog):
    assert "non_field_errors" in errors_of([body()])


def test_order_body_is_exactly_the_contract(catalog, reserve):
    order = reserve({"TEE-M": 2, "MUG": 3}, on_shortage="ask")
    data = order_body(order)
    assert set(data) == {
        "id",
        "number",
        "status",
        "fulfillment",
        "lines",
        "total",
        "currency",
        "payment",
        "reservation_expires_at",
        "created_at",
        "cancellation",
    }
    assert data["id"] == str(order.id)
    assert data["number"] == order.number
    assert data["status"] == "awaiting_decision"
    assert data["fulfillment"] == "unfulfilled"
    assert data["lines"] == [
        {
            "sku": "TEE-M",
            "quantity_requested": 2,
            "quantity_confirmed": 2,
            "quantity_shipped": 0,
            "quantity_returned": 0,
            "status": "reserved",
            "unit_price": "19.99",
        },
        {
            "sku": "MUG",
            "quantity_requested": 3,
            "quantity_confirmed": 2,
            "quantity_shipped": 0,
            "quantity_returned": 0,
            "status": "reserved",
            "unit_price": "7.50",
        },
    ]
    assert data["total"] == "54.98" and data["currency"] == "EUR"
    assert data["payment"] == {
        "status": "none",
        "amount_captured": "0.00",
        "amount_refunded": "0.00",
    }
    assert data["reservation_expires_at"].endswith("Z")
    assert data["created_at"].endswith("Z")
    assert data["cancellation"] is None
