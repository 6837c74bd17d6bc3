"""Reads of the catalog and stock."""

import functools
from collections.abc import Mapping
from typing import Any

from django.db import connections, router
from django.db.models import F, Q, QuerySet, Sum
from django.db.models.functions import Coalesce

from core.errors import NotFound
from core.rows import RowReader, column, select_list

from .models import Product, Reservation, StockItem


def product_list() -> QuerySet[Product]:
    """Return products with their availability, ordered for cursor pagination."""
    return Product.objects.select_related("stock").annotate(
        available=F("stock__on_hand") - F("stock__reserved")
    )


@functools.cache
def _products_by_sku_sql(alias: str) -> str:
    """`Product.objects.select_related("stock").filter(sku__in=...)`'s SQL, written once."""
    quote = connections[alias].ops.quote_name
    stock_product = column(StockItem, "product", alias=alias)
    return (
        f"SELECT {select_list(Product, 'p', alias=alias)},"
        f" {select_list(StockItem, 's', alias=alias)}"
        f" FROM {quote(Product._meta.db_table)} p"
        f" LEFT OUTER JOIN {quote(StockItem._meta.db_table)} s"
        f" ON s.{stock_product} = p.{column(Product, 'id', alias=alias)}"
        f" WHERE p.{column(Product, 'sku', alias=alias)} = ANY(%s)"
    )


def products_by_sku(*, skus: list[str]) -> dict[str, Product]:
    """The products among `skus`, by sku, with their stock row (unknown skus are absent).

    Every keyed checkout reads its products here, the same way: the SQL is
    written once per process (`core.rows`), one statement as before, and
    each row becomes the product with its stock cached on it as
    `select_related("stock")` caches it (a product without a stock row
    caches none: reading `product.stock` raises, as it does after the ORM's
    join).
    """
    if not skus:
        return {}
    alias = router.db_for_read(Product)
    products, stocks = RowReader.of(Product, alias), RowReader.of(StockItem, alias)
    with connections[alias].cursor() as cursor:
        cursor.execute(_products_by_sku_sql(alias), [list(skus)])
        rows = cursor.fetchall()
    by_sku: dict[str, Product] = {}
    link = StockItem._meta.get_field("product")
    for row in rows:
        product = products.read(row[: products.width])
        stock_row = row[products.width :]
        stock = stocks.read(stock_row) if stock_row[0] is not None else None
        link.remote_field.set_cached_value(product, stock)
        if stock is not None:
            link.set_cached_value(stock, product)
        by_sku[product.sku] = product
    return by_sku


def product_get(*, sku: str) -> Product:
    """Return one product by sku, or raise not_found."""
    # PostgreSQL text cannot hold NUL (the driver refuses the query): no sku has one.
    if "\x00" in sku:
        raise NotFound(f"No product with sku {sku!r}.")
    product = product_list().filter(sku=sku).first()
    if product is None:
        raise NotFound(f"No product with sku {sku!r}.")
    return product


def stock_drift() -> list[Mapping[str, Any]]:
    """Return stock items whose `reserved` differs from the sum of their held flags.

    Empty when the books balance; a reconciliation check, never a repair.
    """
    held = Sum("reservations__quantity", filter=Q(reservations__state=Reservation.State.HELD))
    rows = (
        StockItem.objects.annotate(held=Coalesce(held, 0))
        .exclude(reserved=F("held"))
        .values("id", "product__sku", "on_hand", "reserved", "held")
    )
    return list(rows)


def reservations_held() -> int:
    """Reservation flags currently held (their units counted in StockItem.reserved)."""
    return Reservation.objects.filter(state=Reservation.State.HELD).count()
