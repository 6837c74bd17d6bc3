"""The shopper's cart: every change moves `Cart.version` by one conditional UPDATE.

A change names the version it was made from (the page the shopper saw), so
a form sent twice — a double click, a resubmitted page, a second tab — finds
the version moved on and changes nothing the second time. The checkout's
request key is built from the version (shop.checkout), and so is the order's
business scope (`cart_scope`, unique among orders), so one version of the
cart is at most one order, for the order's whole life. The order moves the
cart in the transaction that keeps or ends it (`cart_order_decided`).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING

from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.functions import Now

from core.errors import ApplicationError
from idempotency.messaging.inbox import inbox_claim
from inventory import selectors as inventory_selectors

from .models import Cart, CartLine

if TYPE_CHECKING:  # an annotation only: the catalog is read through inventory's selectors
    from inventory.models import Product

MAX_QUANTITY = 1000
# A session cart is kept in the session row: a bound on its size.
MAX_GUEST_LINES = 100
GUEST_CART = "shop.guest_cart"
# The inbox consumer that records merged guest carts (their ids).
GUEST_MERGE = "shop.guest_cart_merge"
_SCOPE = re.compile(r"^cart:(?P<cart>\d+):(?P<version>\d+)$")


class CartChanged(ApplicationError):
    """The cart moved on since the page the shopper sent the form from."""

    status = 409
    code = "cart_changed"


class CartFull(ApplicationError):
    """A session cart already holds MAX_GUEST_LINES different skus."""

    status = 409
    code = "cart_full"


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


def _items(lines: list[tuple[str, int]]) -> list[CartItem]:
    products = {
        product.sku: product
        for product in inventory_selectors.product_list().filter(sku__in=[s for s, _ in lines])
    }
    return [CartItem(sku=sku, quantity=n, product=products.get(sku)) for sku, n in lines]


def cart_items(*, cart: Cart) -> list[CartItem]:
    """Return the cart's lines in the order they were added, with current products."""
    return _items(list(cart.lines.order_by("added_at", "id").values_list("sku", "quantity")))


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


def cart_attempt_over(*, cart_id: int, version: int) -> bool:
    """The checkout of `version` ended without an order to keep (declined, expired, refused):
    move the cart on, lines kept, so the next attempt is a new request key. Once only."""
    return _advance(cart_id=cart_id, version=version)


def cart_scope(*, cart_id: int, version: int) -> str:
    """The business scope of ordering this version of the cart (`Order.scope`): one order."""
    return f"cart:{cart_id}:{version}"


@transaction.atomic(savepoint=False)
def cart_order_decided(*, scope: str, kept: bool, ordered: dict[str, int]) -> None:
    """Make the cart follow the order placed from one of its versions (ORDERS_SCOPE_HANDLER).

    Called by orders in the transaction whose conditional UPDATE kept or ended
    the order, so once per order, whether or not the shopper sees a page
    (docs/checkout.md, "One order per cart version"):

    - kept (confirmed, partially confirmed): the ordered quantities leave the
      cart, sku by sku — `ordered` is what the order asked for, the cart
      version's lines — so a line or units added later stay; the cart moves to
      its next version, so a checkout page shown before is "your cart changed";
    - ended (declined, expired, cancelled while awaiting the decision): the cart
      moves on with its lines if it is still at that version, so the next
      "Place order" is a new attempt (that version stays its ended order's).

    The cart row is updated first (its lock), then its lines in sku order.
    """
    match = _SCOPE.match(scope)
    if match is None:  # not a cart's scope
        return
    cart_id, version = int(match["cart"]), int(match["version"])
    if not kept:
        _advance(cart_id=cart_id, version=version)
        return
    if not Cart.objects.filter(id=cart_id).update(version=F("version") + 1, updated_at=Now()):
        return  # no such cart any more
    for sku in sorted(ordered):
        quantity = ordered[sku]
        lines = CartLine.objects.filter(cart_id=cart_id, sku=sku)
        lines.filter(quantity__lte=quantity).delete()
        lines.filter(quantity__gt=quantity).update(quantity=F("quantity") - quantity)


@transaction.atomic
def cart_merge(*, cart_id: int, guest_id: str, lines: list[tuple[str, int]]) -> bool:
    """Merge a guest cart's lines into a shopper's cart, once per guest cart id.

    The guest cart's id is claimed in the inbox first, in this transaction: a
    second merge of the same guest cart (a double-submitted log-in) finds it
    and changes nothing. A sku in both gets the sum, capped at 1000. The
    cart's version moves on (an UPDATE, which also locks the cart row), so a
    checkout page shown before the merge is "your cart changed", not an order
    of what it no longer shows.
    """
    if not lines or not inbox_claim(consumer=GUEST_MERGE, message_id=guest_id):
        return False
    Cart.objects.filter(id=cart_id).update(version=F("version") + 1, updated_at=Now())
    existing = {
        line.sku: line
        for line in CartLine.objects.select_for_update()
        .filter(cart_id=cart_id, sku__in=[sku for sku, _ in lines])
        .order_by("id")
    }
    for sku, quantity in lines:
        line = existing.get(sku)
        if line is None:
            existing[sku] = CartLine.objects.create(
                cart_id=cart_id, sku=sku, quantity=min(quantity, MAX_QUANTITY)
            )
        else:
            line.quantity = min(line.quantity + quantity, MAX_QUANTITY)
            line.save(update_fields=["quantity"])
    return True


# --- The guest's cart, in the session ------------------------------------------


@dataclass
class GuestCart:
    """The session cart of a shopper not logged in: `{"id", "version", "lines"}` in the session.

    `id` names this cart for the once-only merge; `version` moves on with
    every change, like `Cart.version`, so a form sent twice changes it once.
    """

    id: str
    version: int
    lines: list[tuple[str, int]]

    def save(self, session) -> None:
        session[GUEST_CART] = {
            "id": self.id,
            "version": self.version,
            "lines": [[sku, n] for sku, n in self.lines],
        }


def guest_cart(*, session) -> GuestCart:
    """The session's guest cart (empty, version 0, with a new id, if it has none)."""
    data = session.get(GUEST_CART)
    if not isinstance(data, dict):
        return GuestCart(id=uuid.uuid4().hex, version=0, lines=[])
    return GuestCart(
        id=str(data["id"]),
        version=int(data["version"]),
        lines=[(str(sku), int(n)) for sku, n in data.get("lines", [])],
    )


def guest_cart_add(*, session, version: int, sku: str, quantity: int) -> None:
    """Add units of a sku to the session cart (capped at 1000) if it is still at `version`."""
    cart = guest_cart(session=session)
    if cart.version != version:
        raise CartChanged("Your cart changed since this page was shown; nothing was added.")
    quantities = dict(cart.lines)
    if sku not in quantities and len(quantities) >= MAX_GUEST_LINES:
        raise CartFull(f"A cart holds at most {MAX_GUEST_LINES} different items.")
    quantities[sku] = min(quantities.get(sku, 0) + quantity, MAX_QUANTITY)
    cart.lines = list(quantities.items())
    cart.version += 1
    cart.save(session)


def guest_cart_set(*, session, version: int, quantities: dict[str, int]) -> None:
    """Set each listed sku's quantity (0 removes it) if the session cart is still at `version`."""
    cart = guest_cart(session=session)
    if cart.version != version:
        raise CartChanged("Your cart changed since this page was shown; nothing was changed.")
    lines = dict(cart.lines)
    for sku, quantity in quantities.items():
        if sku not in lines:
            continue
        if quantity <= 0:
            del lines[sku]
        else:
            lines[sku] = min(quantity, MAX_QUANTITY)
    cart.lines = list(lines.items())
    cart.version += 1
    cart.save(session)


def guest_cart_items(*, session) -> list[CartItem]:
    return _items(guest_cart(session=session).lines)


def guest_cart_merge(*, session, user) -> bool:
    """After log-in or sign-up: merge the session's guest cart into the shopper's, then drop it.

    True if this call merged it. Safe to repeat (the inbox, see cart_merge).
    """
    data = session.get(GUEST_CART)
    if not isinstance(data, dict):
        return False
    guest = guest_cart(session=session)
    merged = cart_merge(cart_id=cart_for(user=user).id, guest_id=guest.id, lines=guest.lines)
    session.pop(GUEST_CART, None)
    return merged
