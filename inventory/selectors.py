"""Reads of the catalog and stock."""

from collections.abc import Mapping
from typing import Any

from django.db.models import F, Q, QuerySet, Sum
from django.db.models.functions import Coalesce

from core.errors import NotFound

from .models import Product, Reservation, StockItem


def product_list() -> QuerySet[Product]:
    """Return products with their availability, ordered for cursor pagination."""
    return Product.objects.select_related("stock").annotate(
        available=F("stock__on_hand") - F("stock__reserved")
    )


def products_by_sku(*, skus: list[str]) -> dict[str, Product]:
    """The products among `skus`, by sku, with their stock row (unknown skus are absent)."""
    return {p.sku: p for p in Product.objects.select_related("stock").filter(sku__in=skus)}


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
