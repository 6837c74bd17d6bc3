"""The storefront's keyed forms: the API's order operations under the forms' own names.

The checkout form runs `orders.operations.order_place_keyed` — the very
operation behind `POST /api/v1/orders/` — under the request key
`checkout:<cart id>:<cart version>`, which the server puts in the rendered
form. The key names the business scope (this version of this cart), not the
browser: two tabs, the back button, a refresh and "resubmit the form?" all
send the same key and land on the one order. (Not the session: Django's
login() cycles it.)

The key is purged after its retention; the scope is not. The order carries
it (`Order.scope` = `cart:<id>:<version>`, unique), so placing a cart
version again — days later, under a fresh key — answers with that version's
order, whatever became of it (docs/checkout.md, "One order per cart
version").

Each operation name here is declared (`keyed_operation`) on a presenter that
answers `303 See Other` to the page showing the outcome, with the same
resume as the API's, so the completer finishes an abandoned form key with
the redirect too.

The cart follows its order in the transaction that keeps or ends it
(`shop.cart.cart_order_decided`, settings.ORDERS_SCOPE_HANDLER):

- an order kept (confirmed, partially confirmed): the ordered lines leave the
  cart (lines added later stay) and the cart moves on;
- an order ended (declined, expired, cancelled while awaiting the decision):
  the cart keeps its lines and moves to the next version, so the next
  "Place order" is a new request key (a new attempt), while the old version
  still answers the old order (a refresh of the declined page still shows
  the decline);
- still undecided (awaiting the shopper's decision, payment pending): nothing
  yet; the same version lands on the same order.

A checkout refused before any order (stock, price) has no order to move the
cart: `checkout_follow_up` does, after the attempt and on the cart and
checkout pages, conditional on the attempted version (once).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, cast

from django.urls import reverse

from idempotency.keys import (
    FINISHED,
    STARTED,
    Reply,
    Result,
    key_lookup,
    keyed_operation,
)
from orders import operations as order_operations
from orders import selectors as order_selectors
from orders.services import LineRequest
from orders.states import OrderStatus

from . import cart as carts
from .models import Cart

CREATE = "shop.order.create"
CONFIRM = "shop.order.confirm"
CANCEL = "shop.order.cancel"

_KEY = re.compile(r"^checkout:(?P<cart>\d+):(?P<version>\d+)$")

KEPT = frozenset({OrderStatus.CONFIRMED, OrderStatus.PARTIALLY_CONFIRMED, OrderStatus.CANCELLING})

if TYPE_CHECKING:  # an annotation only: stock is read through inventory's selectors
    from inventory.models import Product


def checkout_key(cart: Cart) -> str:
    """The request key of checking out this version of the cart."""
    return f"checkout:{cart.id}:{cart.version}"


def checkout_scope(cart: Cart, version: int | None = None) -> str:
    """The business scope of ordering this version of the cart (the current one by default)."""
    return carts.cart_scope(cart_id=cart.id, version=cart.version if version is None else version)


def order_of_version(*, cart: Cart, version: int):
    """The id of the order placed from this version of the cart, or None."""
    found = order_selectors.order_of_scope(
        owner_id=cart.user_id, scope=checkout_scope(cart, version)
    )
    return None if found is None else found[0]


def key_under_way(*, owner_id: int, key: str) -> bool:
    """Has this checkout key got past its first phase (an order exists, payment under way)?"""
    row = key_lookup(owner_id=owner_id, key=key)
    return row is not None and row.recovery_point != STARTED


def line_requests(items: list[carts.CartItem]) -> list[LineRequest]:
    """The order lines of the cart's items. A product is None only under a key past
    STARTED (the view refuses it otherwise), whose resumed run never reads the lines."""
    return [
        LineRequest(product=cast("Product", item.product), quantity=item.quantity) for item in items
    ]


def cancel_key(order) -> str:
    """The "Cancel order" form's request key on a confirmed order's page: the order and the
    status it was shown in. Two tabs, a double click and a resubmitted page send the same
    key: one cancellation, the others replay its answer (303 to the order page)."""
    return f"cancel:{order.id}:{order.status}"


def checkout_key_version(key: str, *, cart: Cart) -> int | None:
    """The cart version a checkout key names, or None if it is not a key of this cart."""
    match = _KEY.match(key or "")
    if match is None or int(match["cart"]) != cart.id:
        return None
    return int(match["version"])


def order_url(order_id) -> str:
    return reverse("order", args=[order_id])


def _refusal_order_id(result: Result):
    if result.value is not None:
        return result.value.id
    return (result.refusal.extra or {}).get("order_id") if result.refusal else None


@keyed_operation(CREATE, resume=order_operations.order_resume)
def checkout_redirect(result: Result) -> Reply:
    """The checkout form's answer: 303 to the order (whatever became of it), else back to
    checkout naming the refusal (insufficient stock, price changed)."""
    order_id = _refusal_order_id(result)
    if order_id is not None:
        return Reply(status=303, headers={"Location": order_url(order_id)})
    assert result.refusal is not None  # no order: a refusal that names none
    return Reply(
        status=303, headers={"Location": f"{reverse('checkout')}?problem={result.refusal.code}"}
    )


@keyed_operation(CONFIRM, resume=order_operations.order_resume)
@keyed_operation(CANCEL)
def decision_redirect(result: Result) -> Reply:
    """The decision page's answer ("Confirm available items", "Cancel order"): 303 to the
    order page; a refusal naming no order (should not happen), to the orders list."""
    order_id = _refusal_order_id(result)
    if order_id is not None:
        location = order_url(order_id)
        if result.value is None:
            assert result.refusal is not None  # the order id came from the refusal
            location += f"?problem={result.refusal.code}"
        return Reply(status=303, headers={"Location": location})
    assert result.refusal is not None  # no order: a refusal that names none
    return Reply(
        status=303, headers={"Location": f"{reverse('orders')}?problem={result.refusal.code}"}
    )


def checkout_follow_up(*, cart: Cart) -> None:
    """Move the cart on after a checkout of its current version refused before any order.

    Insufficient stock or a changed price: the key is finished with no order,
    so the next "Place order" must be a new key (lines kept). A version with an
    order is left to the order (it moves the cart when kept or ended), among
    them a refusal `already_ordered` naming an order still undecided.
    Idempotent: conditional on the version.
    """
    row = key_lookup(owner_id=cart.user_id, key=checkout_key(cart))
    if row is None or row.recovery_point != FINISHED or (row.data or {}).get("order_id"):
        return
    if order_of_version(cart=cart, version=cart.version) is not None:
        return
    carts.cart_attempt_over(cart_id=cart.id, version=cart.version)
