"""The checkout's products read (`products_by_sku`): the ORM's instances, not its compile."""

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from inventory.models import Product, StockItem
from inventory.selectors import products_by_sku
from tests.support.compiles import orm_compiles


def _fields(instance) -> dict:
    return {f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields}


@pytest.mark.django_db
def test_the_products_are_the_orms_with_their_stock_cached(make_product):
    make_product("A", price="5.10", stock=3)
    make_product("B", stock=7)
    make_product("C")
    orm = {p.sku: p for p in Product.objects.select_related("stock").filter(sku__in=["A", "B"])}

    with CaptureQueriesContext(connection) as queries:
        found = products_by_sku(skus=["B", "A", "missing"])
        stocks = {sku: _fields(product.stock) for sku, product in found.items()}
        back = {sku: product.stock.product is product for sku, product in found.items()}

    assert len(queries) == 1
    assert sorted(found) == ["A", "B"]
    assert {sku: _fields(p) for sku, p in found.items()} == {
        sku: _fields(p) for sku, p in orm.items()
    }
    assert stocks == {sku: _fields(p.stock) for sku, p in orm.items()}
    assert back == {"A": True, "B": True}
    assert found["A"].price == Decimal("5.10") and found["A"]._state.adding is False


@pytest.mark.django_db
def test_a_product_without_stock_caches_none_as_the_join_does():
    Product.objects.create(sku="BARE", name="bare", price=Decimal("1.00"), currency="EUR")

    found = products_by_sku(skus=["BARE"])["BARE"]

    with CaptureQueriesContext(connection) as queries, pytest.raises(StockItem.DoesNotExist):
        found.stock  # noqa: B018 - the read is the test
    assert len(queries) == 0


@pytest.mark.django_db
def test_the_read_compiles_no_orm_query(make_product):
    make_product("A")
    products_by_sku(skus=["A"])  # the SQL is written on a process's first read

    with orm_compiles() as compiles:
        assert list(products_by_sku(skus=["A"])) == ["A"]
    assert compiles == []
