"""Writes to the catalog and stock."""

from __future__ import annotations

from decimal import Decimal

from django.db import IntegrityError, transaction

from idempotency.errors import ApplicationError
from idempotency.money import check_currency

from .models import Product, StockItem


class SkuExists(ApplicationError):
    status = 409
    code = "sku_exists"
    title = "SKU exists"


def _violated_constraint(exc: IntegrityError) -> str | None:
    cause = exc.__cause__
    diag = getattr(cause, "diag", None)
    return getattr(diag, "constraint_name", None)


@transaction.atomic
def product_create(*, sku: str, name: str, price: Decimal, currency: str, stock: int) -> Product:
    """Create a product with its stock; a taken sku is refused by the unique constraint."""
    check_currency(currency)
    product = Product(sku=sku, name=name, price=price, currency=currency)
    try:
        with transaction.atomic():
            product.save(force_insert=True)
    except IntegrityError as exc:
        if _violated_constraint(exc) == "inventory_product_sku_uniq":
            raise SkuExists(f"A product with sku {sku!r} already exists.") from exc
        raise
    StockItem.objects.create(product=product, on_hand=stock, reserved=0)
    return product
