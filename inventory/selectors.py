"""Reads of the catalog."""

from django.db.models import F, QuerySet

from idempotency.errors import NotFound

from .models import Product


def product_list() -> QuerySet[Product]:
    """Return products with their availability, ordered for cursor pagination."""
    return Product.objects.select_related("stock").annotate(
        available=F("stock__on_hand") - F("stock__reserved")
    )


def product_get(*, sku: str) -> Product:
    """Return one product by sku, or raise not_found."""
    product = product_list().filter(sku=sku).first()
    if product is None:
        raise NotFound(f"No product with sku {sku!r}.")
    return product
