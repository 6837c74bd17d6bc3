"""The catalog, a product, the cart (a shopper's or a guest's) and the checkout form.

The checkout is keyed (`idempotency.views.idempotent_form`, operation
`shop.checkout.CREATE`): the page's key is the cart's version, so the same
cart sent twice is one order (shop/checkout.py).
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import get_language
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods

from core.errors import InvalidRequest, NotFound
from idempotency.views import idempotent_form
from inventory import selectors as inventory_selectors
from orders import operations as order_operations
from orders import selectors as order_selectors

from .. import cart as carts
from .. import checkout
from ..forms import CheckoutForm, QuantityForm
from .common import form_refusal, problem_text, refuse_couriers, see_other

SEARCH_MAX = 100  # characters of a catalog search that are used


@require_GET
def catalog(request: HttpRequest) -> HttpResponse:
    """The catalog; `?q=` keeps the products whose name or sku contains it (any case)."""
    query = request.GET.get("q", "").strip()[:SEARCH_MAX]
    products = inventory_selectors.product_list()
    if query:
        products = products.filter(Q(name__icontains=query) | Q(sku__icontains=query))
    context = {"products": products.order_by("name", "sku"), "query": query}
    return render(request, "shop/catalog.html", context)


def _product_or_404(sku: str):
    try:
        return inventory_selectors.product_get(sku=sku)
    except NotFound:
        raise Http404("No such product.") from None


@require_http_methods(["GET", "POST"])
@refuse_couriers
def product_page(request: HttpRequest, sku: str) -> HttpResponse:
    product = _product_or_404(sku)
    form = QuantityForm()
    status = 200
    if request.method == "POST":
        form = QuantityForm(request.POST)
        if form.is_valid():
            quantity = form.cleaned_data["quantity"]
            try:
                version = int(request.POST.get("cart_version", ""))
                if request.user.is_authenticated:
                    carts.cart_add(
                        cart=carts.cart_for(user=request.user),
                        version=version,
                        sku=product.sku,
                        quantity=quantity,
                    )
                else:  # a guest: the session cart, merged on log-in
                    carts.guest_cart_add(
                        session=request.session, version=version, sku=product.sku, quantity=quantity
                    )
            except (ValueError, carts.CartChanged):
                messages.warning(
                    request,
                    _(
                        "Your cart changed since this page was shown (in another tab?), so "
                        "nothing was added. Check your cart, then add the item again."
                    ),
                )
                return see_other(request.path)
            except carts.CartFull:
                messages.error(
                    request,
                    _("A cart holds at most {limit} different items. Log in to keep more.").format(
                        limit=carts.MAX_GUEST_LINES
                    ),
                )
                return see_other(request.path)
            messages.success(
                request,
                _("Added {quantity} × {name} to your cart.").format(
                    quantity=quantity, name=product.name
                ),
            )
            return see_other(reverse("cart"))
        status = 400
    context = {"product": product, "form": form, "cart_version": _cart_version(request)}
    return render(request, "shop/product.html", context, status=status)


def _cart_version(request: HttpRequest) -> int:
    """The version of the cart the page shows: the shopper's, or the guest's session cart."""
    if request.user.is_authenticated:
        return carts.cart_for(user=request.user).version
    return carts.guest_cart(session=request.session).version


@require_http_methods(["GET", "POST"])
@refuse_couriers
def cart_page(request: HttpRequest) -> HttpResponse:
    if not request.user.is_authenticated:
        return _guest_cart_page(request)
    cart = carts.cart_for(user=request.user)
    if request.method == "POST":
        return _cart_post(
            request,
            lambda version, quantities: carts.cart_set(
                cart=cart, version=version, quantities=quantities
            ),
        )
    checkout.checkout_follow_up(cart=cart)
    cart.refresh_from_db()
    items = carts.cart_items(cart=cart)
    return render(
        request,
        "shop/cart.html",
        {"cart_version": cart.version, "items": items, "total": carts.cart_total(items)},
    )


def _guest_cart_page(request: HttpRequest) -> HttpResponse:
    """The cart of a shopper not logged in (the session's); checkout asks to log in first."""
    if request.method == "POST":
        return _cart_post(
            request,
            lambda version, quantities: carts.guest_cart_set(
                session=request.session, version=version, quantities=quantities
            ),
        )
    items = carts.guest_cart_items(session=request.session)
    context = {
        "cart_version": carts.guest_cart(session=request.session).version,
        "items": items,
        "total": carts.cart_total(items),
        "guest": True,
    }
    return render(request, "shop/cart.html", context)


def _cart_post(
    request: HttpRequest, cart_set: Callable[[int, dict[str, int]], object]
) -> HttpResponse:
    """The cart form's POST (the shopper's or the guest's `cart_set`): 303 back to the cart."""
    try:
        version = int(request.POST.get("cart_version", ""))
        cart_set(version, _posted_quantities(request))
    except carts.CartChanged:
        messages.warning(
            request,
            _(
                "Your cart changed since this page was shown (in another tab?), so nothing was "
                "changed. Here it is as it is now."
            ),
        )
    except (ValueError, InvalidRequest):
        messages.error(request, _("Enter a quantity between 0 and 1000."))
    else:
        messages.success(request, _("Your cart was updated."))
    return see_other(reverse("cart"))


def _posted_quantities(request: HttpRequest) -> dict[str, int]:
    sku = request.POST.get("sku", "")
    if request.POST.get("action") == "remove":
        return {sku: 0}
    quantity = int(request.POST.get("quantity", ""))
    if not 0 <= quantity <= carts.MAX_QUANTITY:
        raise InvalidRequest("quantity out of range")
    return {sku: quantity}


# --- Checkout -----------------------------------------------------------------


CHECKOUT_FIELDS = "shop.checkout_fields"


def _last_address(user) -> dict:
    orders = order_selectors.order_list_for_user(user=user).filter(owner=user)
    last = orders.order_by("-number").values_list("shipping_address", flat=True).first()
    return dict(last) if last else {}


def _checkout_page(request, *, form=None, problem=None, status=200) -> HttpResponse:
    cart = carts.cart_for(user=request.user)
    checkout.checkout_follow_up(cart=cart)
    cart.refresh_from_db()
    items = carts.cart_items(cart=cart)
    if not items:
        messages.info(request, _("Your cart is empty: add something first."))
        return see_other(reverse("cart"))
    total = carts.cart_total(items)
    if form is None:
        typed = request.session.pop(CHECKOUT_FIELDS, None) or _last_address(request.user)
        form = CheckoutForm(initial={**typed, "expected_total": total})
    context = {
        "cart": cart,
        "items": items,
        "total": total,
        "form": form,
        "request_key": checkout.checkout_key(cart),
        "problem": problem,
        "problem_text": problem_text(problem),
        "short": [item for item in items if item.quantity > item.available],
    }
    return render(request, "shop/checkout.html", context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
@refuse_couriers
def checkout_page(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _checkout_page(request, problem=request.GET.get("problem"))
    response = _checkout_submit(request)
    # An order moves the cart itself (kept or ended); a refusal before any order: here, once.
    checkout.checkout_follow_up(cart=carts.cart_for(user=request.user))
    if response.status_code == 303 and response["Location"].startswith(reverse("checkout")):
        # Refused (stock, price): the form comes back with what the shopper typed.
        request.session[CHECKOUT_FIELDS] = {
            name: request.POST.get(name, "") for name in CheckoutForm.base_fields
        }
    return response


@idempotent_form(operation=checkout.CREATE, refusal=form_refusal)
def _checkout_submit(request: HttpRequest, *, key) -> HttpResponse | None:
    cart = carts.cart_for(user=request.user)
    form = CheckoutForm(request.POST)
    version = checkout.checkout_key_version(key.key, cart=cart)
    if version is None:
        return _checkout_page(request, form=form, problem="cart_changed", status=409)
    if version != cart.version:
        # An older version of the cart: a key already under way goes on (it answers its
        # own order); a version that has its order answers with it, key or no key (the
        # key purged after its retention: docs/checkout.md, "One order per cart version");
        # anything else would order what the page no longer shows.
        assert request.user.pk is not None  # checkout is for logged-in shoppers
        if not checkout.key_under_way(owner_id=request.user.pk, key=key.key):
            placed = checkout.order_of_version(cart=cart, version=version)
            if placed is not None:
                return see_other(checkout.order_url(placed))
            return _checkout_page(request, form=form, problem="cart_changed", status=409)
    if not form.is_valid():
        return _checkout_page(request, form=form, status=400)
    items = carts.cart_items(cart=cart)
    if version == cart.version:
        if not items and (placed := checkout.order_of_version(cart=cart, version=version)):
            # The cart was read before another submit of this version kept its order
            # and emptied it: that order answers (one order per cart version).
            return see_other(checkout.order_url(placed))
        if not items:
            messages.info(request, _("Your cart is empty: add something first."))
            return see_other(reverse("cart"))
        if any(item.product is None for item in items):
            messages.error(request, _("An item in your cart is no longer sold; remove it first."))
            return see_other(reverse("cart"))
    data = form.cleaned_data
    order_operations.order_place_keyed(
        run=key.claim(),
        present=checkout.checkout_redirect,
        user=request.user,
        # A product is None only under a key past STARTED (refused above otherwise),
        # whose resumed run never reads the lines.
        lines=checkout.line_requests(items),
        on_shortage=data["on_shortage"],
        payment_method=data["payment_method"],
        shipping_address=form.shipping_address(),
        expected_total=data["expected_total"],
        # One order per cart version for the order's whole life: the same version
        # placed under a fresh key answers `already_ordered` (303 to that order).
        scope=checkout.checkout_scope(cart, version),
        # The page's language: the order's e-mails are written in it.
        language=get_language(),
    )
    return None
