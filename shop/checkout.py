"""The storefront's keyed forms: the API's order operations under the forms' own names.

The checkout form runs `orders.operations.order_place_keyed` — the very
operation behind `POST /api/v1/orders/` — under the request key
`checkout:<cart id>:<cart version>`, which the server puts in the rendered
form. The key names the business scope (this version of this cart), not the
browser: two tabs, the back button, a refresh and "resubmit the form?" all
send the same key and land on the one order. (Not the session: Django's
login() cycles it.)

Each operation name here is registered with the same resume as the API's and
with a presenter that answers `303 See Other` to the page showing the
outcome, so the completer finishes an abandoned form key with the redirect
too (shop/apps.py).

After an attempt the cart follows its outcome (`checkout_follow_up`), each
step a conditional UPDATE on the attempted version, so doing it again (a
replay, the next page view) changes nothing:

- an order to keep (confirmed, partially confirmed): the cart is emptied;
- an attempt that ended without one (declined, expired, cancelled while
  awaiting the decision, refused for stock or price): the cart keeps its
  lines and moves to the next version, so the next "Place order" is a new
  request key (a new attempt), while the old key still replays the old
  outcome (a refresh of the declined page still shows the decline);
- still undecided (awaiting the shopper's decision, payment pending): nothing
  yet; the same key joins the same order.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, cast

from django.urls import reverse

from idempotency.keys import key_lookup
from idempotency.operations import (
    FINISHED,
    STARTED,
    Reply,
    Result,
    register_operation,
    single_phase_resume,
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
ENDED = frozenset({OrderStatus.PAYMENT_FAILED, OrderStatus.EXPIRED, OrderStatus.CANCELLED})

if TYPE_CHECKING:  # an annotation only: stock is read through inventory's selectors
    from inventory.models import Product


def checkout_key(cart: Cart) -> str:
    """The request key of checking out this version of the cart."""
    return f"checkout:{cart.id}:{cart.version}"


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


def register_operations() -> None:
    """Register the forms' operation names for the completer (from ShopConfig.ready)."""
    register_operation(CREATE, resume=order_operations.order_resume, present=checkout_redirect)
    register_operation(CONFIRM, resume=order_operations.order_resume, present=decision_redirect)
    register_operation(CANCEL, resume=single_phase_resume, present=decision_redirect)
    # The return form (shop/returns.py): one phase, its own 303 presenter.
    from . import returns

    register_operation(returns.CREATE, resume=single_phase_resume, present=returns.return_redirect)


def checkout_follow_up(*, cart: Cart) -> None:
    """Make the cart follow what became of the checkout of its current version (idempotent)."""
    row = key_lookup(owner_id=cart.user_id, key=checkout_key(cart))
    if row is None:
        return
    order_id = (row.data or {}).get("order_id")
    if order_id is None:
        if row.recovery_point == FINISHED:  # refused before any order: stock, price
            carts.cart_attempt_over(cart_id=cart.id, version=cart.version)
        return
    if row.recovery_point == STARTED:
        return
    status = order_selectors.order_get(order_id=order_id).status
    if status in KEPT:
        carts.cart_checked_out(cart_id=cart.id, version=cart.version)
    elif status in ENDED:
        carts.cart_attempt_over(cart_id=cart.id, version=cart.version)
