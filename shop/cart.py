"""The shopper's cart: every change moves `Cart.version` by one conditional UPDATE.

A change names the version it was made from (the page the shopper saw), so
a form sent twice — a double click, a resubmitted page, a second tab — finds
the version moved on and changes nothing the second time. The checkout's
request key is built from the version (shop.checkout), so one version of the
cart is at most one order.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.functions import Now

from core.errors import ApplicationError
from inventory import selectors as inventory_selectors
from inventory.models import Product

from .models import Cart, CartLine

MAX_QUANTITY = 1000


class CartChanged(ApplicationError):
    """The cart moved on since the page the shopper sent the form from."""

    status = 409
    code = "cart_changed"


@dataclass(frozen=True)
class CartItem:
    """One line of the cart with its product as the catalog shows it now."""

    sku: str
    quantity: int
    product: Product | None  # None: the product left the catalog

    @property
    def available(self) -> int:
        # product_list()'s annotation; its QuerySet[Product] type does not carry it.
        return 0 if self.product is None else max(self.product.available, 0)  # type: ignore[attr-defined]

    @property
    def subtotal(self) -> Decimal:
        return Decimal(0) if self.product is None else self.product.price * self.quantity


def cart_for(*, user) -> Cart:
    """Return the shopper's cart, creating it (insert first; the unique user decides)."""
    cart = Cart.objects.filter(user=user).first()
    if cart is not None:
        return cart
    try:
        with transaction.atomic():
            return Cart.objects.create(user=user)
    except IntegrityError:
        return Cart.objects.get(user=user)


def cart_items(*, cart: Cart) -> list[CartItem]:
    """Return the cart's lines in the order they were added, with current products."""
    lines = list(cart.lines.order_by("added_at", "id"))
    products = {
        product.sku: product
        for product in inventory_selectors.product_list().filter(sku__in=[x.sku for x in lines])
    }
    return [CartItem(sku=x.sku, quantity=x.quantity, product=products.get(x.sku)) for x in lines]


def cart_total(items: list[CartItem]) -> Decimal:
    return sum((item.subtotal for item in items), Decimal(0))


def _advance(*, cart_id: int, version: int) -> bool:
    """Move the cart from `version` to the next one; False if it is not at `version` any more."""
    return bool(
        Cart.objects.filter(id=cart_id, version=version).update(
            version=F("version") + 1, updated_at=Now()
        )
    )


@transaction.atomic
def cart_add(*, cart: Cart, version: int, sku: str, quantity: int) -> None:
    """Add units of a sku (capped at 1000 a line) if the cart is still at `version`."""
    if not _advance(cart_id=cart.id, version=version):
        raise CartChanged("Your cart changed since this page was shown; nothing was added.")
    line = CartLine.objects.select_for_update().filter(cart_id=cart.id, sku=sku).first()
    if line is None:
        CartLine.objects.create(cart_id=cart.id, sku=sku, quantity=min(quantity, MAX_QUANTITY))
    else:
        line.quantity = min(line.quantity + quantity, MAX_QUANTITY)
        line.save(update_fields=["quantity"])


@transaction.atomic
def cart_set(*, cart: Cart, version: int, quantities: dict[str, int]) -> None:
    """Set each listed sku's quantity (0 removes it) if the cart is still at `version`."""
    if not _advance(cart_id=cart.id, version=version):
        raise CartChanged("Your cart changed since this page was shown; nothing was changed.")
    for sku, quantity in quantities.items():
        if quantity <= 0:
            CartLine.objects.filter(cart_id=cart.id, sku=sku).delete()
        else:
            CartLine.objects.filter(cart_id=cart.id, sku=sku).update(
                quantity=min(quantity, MAX_QUANTITY)
            )


@transaction.atomic
def cart_checked_out(*, cart_id: int, version: int) -> bool:
    """The order of `version` succeeded: empty the cart, once (only if still at `version`)."""
    if not _advance(cart_id=cart_id, version=version):
        return False
    CartLine.objects.filter(cart_id=cart_id).delete()
    return True


def cart_attempt_over(*, cart_id: int, version: int) -> bool:
    """The checkout of `version` ended without an order to keep (declined, expired, refused):
    move the cart on, lines kept, so the next attempt is a new request key. Once only."""
    return _advance(cart_id=cart_id, version=version)
