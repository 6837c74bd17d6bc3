"""The storefront's pages: plain Django views over the API's services and keyed operations.

Every form answers Post/Redirect/Get: a 303 to the page that shows the
outcome, or the form again with a clear message. The keyed forms (checkout,
the decision on a short order) run through `idempotency.views.idempotent_form`
under the storefront's own operation names (shop/checkout.py).
"""

from __future__ import annotations

import functools
import hashlib
import math
from decimal import Decimal

from django.contrib import messages
from django.contrib.auth import login as auth_login
from django.contrib.auth import logout as auth_logout
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import LoginView
from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse, reverse_lazy
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.errors import InvalidRequest, NotFound
from core.money import shop_currency
from idempotency.views import form_refusal as keyed_form_refusal
from idempotency.views import idempotent_form
from inventory import selectors as inventory_selectors
from orders import operations as order_operations
from orders import returns as order_returns
from orders import selectors as order_selectors
from orders import tracking
from orders.states import OrderStatus
from payments import selectors as payment_selectors

from . import cart as carts
from . import checkout, history, loyalty, selectors, services, words
from . import returns as shop_returns
from .api.throttles import login_wait
from .forms import (
    PAYMENT_METHODS,
    CheckoutForm,
    EmailChangeForm,
    PasswordChangeForm,
    PasswordResetForm,
    QuantityForm,
    ReturnForm,
    SetPasswordForm,
    SignupForm,
)

ORDERS_PAGE = 20  # orders per page of /orders/
SEARCH_MAX = 100  # characters of a catalog search that are used


def see_other(url: str) -> HttpResponseRedirect:
    response = HttpResponseRedirect(url)
    response.status_code = 303
    return response


# A keyed form the request-key machinery refused (in use, reused, malformed key),
# in the storefront's words and page.
form_refusal = functools.partial(
    keyed_form_refusal, texts=words.FORM_REFUSALS, template="shop/form_refusal.html"
)


def _problem_text(code: str | None) -> str | None:
    if not code:
        return None
    return words.PROBLEMS.get(code, "Something went wrong; nothing was charged twice.")


# --- Catalog and cart ---------------------------------------------------------


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
                    "Your cart changed since this page was shown (in another tab?), so "
                    "nothing was added. Check your cart, then add the item again.",
                )
                return see_other(request.path)
            except carts.CartFull as exc:
                messages.error(request, f"{exc.detail} Log in to keep more.")
                return see_other(request.path)
            messages.success(request, f"Added {quantity} × {product.name} to your cart.")
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
def cart_page(request: HttpRequest) -> HttpResponse:
    if not request.user.is_authenticated:
        return _guest_cart_page(request)
    cart = carts.cart_for(user=request.user)
    if request.method == "POST":
        try:
            version = int(request.POST.get("cart_version", ""))
            quantities = _posted_quantities(request)
            carts.cart_set(cart=cart, version=version, quantities=quantities)
        except carts.CartChanged:
            messages.warning(
                request,
                "Your cart changed since this page was shown (in another tab?), so nothing was "
                "changed. Here it is as it is now.",
            )
        except (ValueError, InvalidRequest):
            messages.error(request, "Enter a quantity between 0 and 1000.")
        else:
            messages.success(request, "Your cart was updated.")
        return see_other(reverse("cart"))
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
        try:
            version = int(request.POST.get("cart_version", ""))
            carts.guest_cart_set(
                session=request.session, version=version, quantities=_posted_quantities(request)
            )
        except carts.CartChanged:
            messages.warning(
                request,
                "Your cart changed since this page was shown (in another tab?), so nothing was "
                "changed. Here it is as it is now.",
            )
        except (ValueError, InvalidRequest):
            messages.error(request, "Enter a quantity between 0 and 1000.")
        else:
            messages.success(request, "Your cart was updated.")
        return see_other(reverse("cart"))
    items = carts.guest_cart_items(session=request.session)
    context = {
        "cart_version": carts.guest_cart(session=request.session).version,
        "items": items,
        "total": carts.cart_total(items),
        "guest": True,
    }
    return render(request, "shop/cart.html", context)


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
        messages.info(request, "Your cart is empty: add something first.")
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
        "problem_text": _problem_text(problem),
        "short": [item for item in items if item.quantity > item.available],
    }
    return render(request, "shop/checkout.html", context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def checkout_page(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _checkout_page(request, problem=request.GET.get("problem"))
    response = _checkout_submit(request)
    # The cart follows the outcome (emptied, or moved on after a final failure): once.
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
        # An older version of the cart: only a key already under way may go on (it
        # answers its own order); anything else would order what the page no longer shows.
        assert request.user.pk is not None  # checkout is for logged-in shoppers
        if not checkout.key_under_way(owner_id=request.user.pk, key=key.key):
            return _checkout_page(request, form=form, problem="cart_changed", status=409)
    if not form.is_valid():
        return _checkout_page(request, form=form, status=400)
    items = carts.cart_items(cart=cart)
    if version == cart.version:
        if not items:
            messages.info(request, "Your cart is empty: add something first.")
            return see_other(reverse("cart"))
        if any(item.product is None for item in items):
            messages.error(request, "An item in your cart is no longer sold; remove it first.")
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
    )
    return None


# --- Orders -------------------------------------------------------------------


def _own_order(request: HttpRequest, order_id: str):
    """The shopper's own order; anyone else's (staff included, here) is not found."""
    try:
        order = order_selectors.order_get_for_user(user=request.user, order_id=order_id)
    except NotFound:
        raise Http404("No such order.") from None
    if order.owner_id != request.user.pk:
        raise Http404("No such order.")
    return order


def _cursor(request: HttpRequest, name: str) -> int | None:
    try:
        value = int(request.GET.get(name, ""))
    except ValueError:
        return None
    return value if value > 0 else None


@login_required
@require_GET
def order_list(request: HttpRequest) -> HttpResponse:
    """The shopper's orders, newest first, ORDERS_PAGE a page.

    Paged by order number (keyset), not by offset: `?before=N` is the page of
    orders older than number N, `?after=N` the page newer than it, so an order
    placed meanwhile never shifts a page or shows twice.
    """
    mine = (
        order_selectors.order_list_for_user(user=request.user)
        # login_required: an authenticated User; the stubs cannot narrow request.user.
        .filter(owner=request.user)  # type: ignore[misc]
    )
    before, after = _cursor(request, "before"), _cursor(request, "after")
    if after is not None and before is None:
        rows = list(mine.filter(number__gt=after).order_by("number")[: ORDERS_PAGE + 1])
        newer = len(rows) > ORDERS_PAGE
        orders = rows[:ORDERS_PAGE][::-1]
        older = bool(orders) and mine.filter(number__lt=orders[-1].number).exists()
    else:
        page = mine.filter(number__lt=before) if before is not None else mine
        rows = list(page.order_by("-number")[: ORDERS_PAGE + 1])
        older = len(rows) > ORDERS_PAGE
        orders = rows[:ORDERS_PAGE]
        newer = (
            before is not None
            and bool(orders)
            and mine.filter(number__gt=orders[0].number).exists()
        )
    context = {
        "orders": orders,
        "older_url": f"{reverse('orders')}?before={orders[-1].number}" if older else None,
        "newer_url": f"{reverse('orders')}?after={orders[0].number}" if newer else None,
        "problem_text": _problem_text(request.GET.get("problem")),
    }
    return render(request, "shop/orders.html", context)


def _order_context(request: HttpRequest, order) -> dict:
    names = dict(
        inventory_selectors.product_list()
        .filter(sku__in=[line.sku for line in order.line_list])
        .values_list("sku", "name")
    )
    payment = order_selectors.order_payment_summary(order=order)
    shipments = []
    for shipment in selectors.shipments_of_order(order_id=order.id):
        shipments.append(
            {
                "shipment": shipment,
                "events": list(tracking.tracking_events(shipment_id=shipment.id)),
                "summary": tracking.tracking_summary(shipment_id=shipment.id),
            }
        )
    return {
        "order": order,
        "lines": [(line, names.get(line.sku, line.sku)) for line in order.line_list],
        "payment": payment,
        "refunded": Decimal(payment["amount_refunded"]) > 0,
        "refunds": list(payment_selectors.refunds_of_payment(payment_id=order.payment_id)),
        "returns": _order_returns(order, names),
        "method_label": dict(PAYMENT_METHODS).get(order.payment_method, order.payment_method),
        "hint": (
            "Your items are on their way."
            if order.fulfillment == "shipped" and order.status in checkout.KEPT
            else words.ORDER_STATUS_HINT.get(order.status, "")
        ),
        "shipments": shipments,
        "problem_text": _problem_text(request.GET.get("problem")),
        "pending": order.status == OrderStatus.PAYMENT_PENDING,
        "cancelling": order.status == OrderStatus.CANCELLING,
        # Confirmed, nothing shipped: the shopper may cancel it (refund, restock).
        "cancellable": order.status in (OrderStatus.CONFIRMED, OrderStatus.PARTIALLY_CONFIRMED)
        and order.fulfillment == "unfulfilled"
        and not any(line.quantity_shipped for line in order.line_list),
        "cancel_key": checkout.cancel_key(order),
        "deciding": order.status == OrderStatus.AWAITING_DECISION,
        "declined": order.status == OrderStatus.PAYMENT_FAILED,
    }


def _order_returns(order, names: dict[str, str]) -> list[dict]:
    """The order's returns, oldest first, with their lines and compensation steps."""
    found = order_returns.returns_of_order(order_id=order.id)
    ids = [r.id for r in found]
    lines = {
        return_id: [(line, names.get(line.sku, line.sku)) for line in found_lines]
        for return_id, found_lines in selectors.return_lines_of(return_ids=ids).items()
    }
    steps = selectors.return_steps_of(return_ids=ids)
    return [
        {"return": r, "lines": lines.get(r.id, []), "steps": steps.get(r.id, [])} for r in found
    ]


@login_required
@require_GET
def order_page(request: HttpRequest, order_id: str) -> HttpResponse:
    order = _own_order(request, order_id)
    checkout.checkout_follow_up(cart=carts.cart_for(user=request.user))
    return render(request, "shop/order.html", _order_context(request, order))


@login_required
@require_GET
def order_status_fragment(request: HttpRequest, order_id: str) -> HttpResponse:
    """The status block of an order on its way (payment pending, being cancelled), polled by
    htmx; once its status is no longer the one the page showed (`?shown=`), the page reloads."""
    order = _own_order(request, order_id)
    response = render(request, "shop/_order_status.html", _order_context(request, order))
    shown = request.GET.get("shown", OrderStatus.PAYMENT_PENDING)
    if order.status != shown:
        checkout.checkout_follow_up(cart=carts.cart_for(user=request.user))
        response["HX-Refresh"] = "true"
    return response


@login_required
@require_POST
def order_confirm(request: HttpRequest, order_id: str) -> HttpResponse:
    order = _own_order(request, order_id)
    response = _confirm_submit(request, order=order)
    checkout.checkout_follow_up(cart=carts.cart_for(user=request.user))
    return response


@idempotent_form(operation=checkout.CONFIRM, refusal=form_refusal)
def _confirm_submit(request: HttpRequest, *, key, order) -> None:
    order_operations.order_confirm_keyed(
        run=key.claim(), present=checkout.decision_redirect, order_id=order.id
    )


@login_required
@require_POST
def order_cancel(request: HttpRequest, order_id: str) -> HttpResponse:
    order = _own_order(request, order_id)
    response = _cancel_submit(request, order=order)
    checkout.checkout_follow_up(cart=carts.cart_for(user=request.user))
    return response


@idempotent_form(operation=checkout.CANCEL, refusal=form_refusal)
def _cancel_submit(request: HttpRequest, *, key, order) -> None:
    order_operations.order_cancel_keyed(
        run=key.claim(), present=checkout.decision_redirect, order_id=order.id
    )


RETURN_FIELDS = "shop.return_fields"


def _return_form(order, names: dict[str, str], data=None) -> ReturnForm:
    shipped = [line for line in order.line_list if line.quantity_shipped > 0]
    returnable = order_returns.returnable_units(order_id=order.id, order_lines=shipped)
    lines = [(line, names.get(line.sku, line.sku), returnable[line.id]) for line in shipped]
    return ReturnForm(data, lines=lines)


def _return_page(request, order, *, form=None, key=None, status=200) -> HttpResponse:
    context = _order_context(request, order)
    names = {line.sku: name for line, name in context["lines"]}
    if form is None:
        typed = request.session.pop(RETURN_FIELDS, None)
        form = _return_form(order, names, data=typed)
        if typed is not None:
            form.is_valid()  # show what was typed (and its errors) after a refusal
    context["form"] = form
    context["request_key"] = key or shop_returns.return_form_key(
        order, after=request.GET.get("after", "")
    )
    context["problem_text"] = _problem_text(request.GET.get("problem"))
    context["any_returnable"] = any(returnable for _line, _name, returnable in form.lines)
    return render(request, "shop/return.html", context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def order_return(request: HttpRequest, order_id: str) -> HttpResponse:
    """The return form: "Quantity" per shipped line and a reason; "Request return" is keyed
    (shop/returns.py) and answers 303 to the order page, or the form with the refusal."""
    order = _own_order(request, order_id)
    if request.method != "POST":
        return _return_page(request, order)
    response = _return_submit(request, order=order)
    if response.status_code == 303 and response["Location"].startswith(
        shop_returns.return_url(order.id)
    ):
        # Refused (more than returnable, not shipped): the form comes back as typed.
        request.session[RETURN_FIELDS] = {
            name: request.POST.get(name, "")
            for name in request.POST
            if name.startswith("quantity_") or name == "reason"
        }
    return response


@idempotent_form(operation=shop_returns.CREATE, refusal=form_refusal)
def _return_submit(request: HttpRequest, *, key, order) -> HttpResponse | None:
    names = dict(
        inventory_selectors.product_list()
        .filter(sku__in=[line.sku for line in order.line_list])
        .values_list("sku", "name")
    )
    form = _return_form(order, names, data=request.POST)
    if not form.is_valid():
        return _return_page(request, order, form=form, key=key.key, status=400)
    order_operations.return_create_keyed(
        run=key.claim(),
        present=functools.partial(
            shop_returns.return_redirect, order_id=order.id, form_key=key.key
        ),
        order_id=order.id,
        lines=[
            order_returns.ReturnLineRequest(sku=sku, quantity=quantity)
            for sku, quantity in form.return_lines()
        ],
        reason=form.cleaned_data["reason"],
        requested_by=request.user,
    )
    return None


# --- Accounts -----------------------------------------------------------------


def _account_page(request: HttpRequest, *, email_form=None, status=200) -> HttpResponse:
    balance, _version = loyalty.loyalty_get(user=request.user)
    purchases = list(history.history_for_user(user=request.user)[:100])
    context = {
        "balance": balance,
        "purchases": purchases,
        "currency": shop_currency(),
        "email_form": email_form
        # Logged-in pages only; the stubs cannot narrow request.user.
        or EmailChangeForm(user=request.user, initial={"email": request.user.email}),  # type: ignore[union-attr]
    }
    return render(request, "shop/account.html", context, status=status)


@login_required
@require_GET
def account_page(request: HttpRequest) -> HttpResponse:
    return _account_page(request)


@login_required
@require_POST
def account_email(request: HttpRequest) -> HttpResponse:
    """ "Change email" on /account/: the new address and the current password; errors are
    the account page again (400) with them tied to the fields."""
    form = EmailChangeForm(request.POST, user=request.user)
    if not form.is_valid():
        return _account_page(request, email_form=form, status=400)
    # login_required: an authenticated User; the stubs cannot narrow request.user.
    services.user_email_change(user=request.user, email=form.cleaned_data["email"])  # type: ignore[arg-type]
    messages.success(request, f"Your e-mail address is now {form.cleaned_data['email']}.")
    return see_other(reverse("account"))


@login_required
@require_POST
def account_delete(request: HttpRequest) -> HttpResponse:
    if request.POST.get("confirm") != "yes":
        messages.error(request, "Tick the box to confirm that you want to delete your account.")
        return see_other(reverse("account"))
    # login_required: an authenticated User; the stubs cannot narrow request.user.
    services.user_anonymise(user=request.user)  # type: ignore[arg-type]
    auth_logout(request)
    messages.success(request, "Your account was deleted. Your orders stay on record, anonymised.")
    return see_other(reverse("catalog"))


def _safe_next(request: HttpRequest) -> str:
    target = request.POST.get("next") or request.GET.get("next") or reverse("catalog")
    if url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return target
    return reverse("catalog")


def _merge_guest_cart(request: HttpRequest, user) -> None:
    """Just logged in or signed up: the session's guest cart joins the shopper's (once)."""
    if carts.guest_cart_merge(session=request.session, user=user):
        messages.info(request, "The items you added before logging in are in your cart.")


@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return see_other(reverse("catalog"))
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            user, _token = services.user_register(
                username=data["username"], email=data["email"], password=data["password"]
            )
        except services.UsernameTaken:
            form.add_error("username", "This username is taken; choose another one.")
        except InvalidRequest as exc:
            for message in (exc.errors or {}).get("password", [exc.detail]):
                form.add_error("password", message)
        else:
            auth_login(request, user, backend="django.contrib.auth.backends.ModelBackend")
            _merge_guest_cart(request, user)
            messages.success(request, f"Welcome, {user.username}! Your account is ready.")
            return see_other(_safe_next(request))
    status = 400 if form.is_bound and form.errors else 200
    return render(
        request, "shop/signup.html", {"form": form, "next": _safe_next(request)}, status=status
    )


def _throttled(request: HttpRequest, *, username: str) -> str | None:
    """Count a log-in (or reset) attempt in the token endpoint's buckets; the refusal's text."""
    wait = login_wait(request, username=username)
    if wait is None:
        return None
    return str(max(1, math.ceil(wait)))


class ShopLoginView(LoginView):
    template_name = "shop/login.html"
    redirect_authenticated_user = True

    def post(self, request, *args, **kwargs):
        # Throttled like POST /api/v1/auth/token/, in the same buckets (per
        # username and per address), before the password is even checked.
        seconds = _throttled(request, username=str(request.POST.get("username", "")))
        if seconds is not None:
            response = self.render_to_response(
                self.get_context_data(
                    form=self.get_form_class()(request),
                    throttled=f"Too many log-in attempts. Try again in {seconds} seconds.",
                ),
                status=429,
            )
            response["Retry-After"] = seconds
            return response
        return super().post(request, *args, **kwargs)

    def form_valid(self, form):
        response = super().form_valid(form)
        _merge_guest_cart(self.request, form.get_user())
        response.status_code = 303
        return response


@require_http_methods(["GET", "POST"])
def logout_page(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        auth_logout(request)
        messages.success(request, "You are logged out.")
        return see_other(reverse("catalog"))
    return render(request, "shop/logout.html")


# --- Password reset and change (Django's views in the shop's templates) --------


class _SeeOther:
    """A form view whose success answers 303 (Post/Redirect/Get), like the shop's forms."""

    def form_valid(self, form):
        response = super().form_valid(form)  # type: ignore[misc]
        if response.status_code == 302:
            response.status_code = 303
        return response


class PasswordResetView(_SeeOther, auth_views.PasswordResetView):
    """`/accounts/password-reset/`: "Email", "Reset password". The same answer whether or not
    the address has an account; throttled in the log-in buckets (per address and per e-mail),
    so the form cannot flood a mailbox."""

    template_name = "shop/password_reset.html"
    form_class = PasswordResetForm
    email_template_name = "shop/email/password_reset.txt"
    html_email_template_name = "shop/email/password_reset.html"
    subject_template_name = "shop/email/password_reset_subject.txt"
    success_url = reverse_lazy("password-reset-done")

    def post(self, request, *args, **kwargs):
        email = str(request.POST.get("email", ""))[:254].strip().lower()
        # Hashed: an address is no cache key (spaces), and the key need not show it.
        digest = hashlib.sha256(email.encode()).hexdigest()[:32]
        seconds = _throttled(request, username=f"password-reset:{digest}")
        if seconds is not None:
            response = self.render_to_response(
                self.get_context_data(
                    form=self.get_form_class()(request.POST),
                    throttled=f"Too many requests. Try again in {seconds} seconds.",
                ),
                status=429,
            )
            response["Retry-After"] = seconds
            return response
        return super().post(request, *args, **kwargs)


class PasswordResetDoneView(auth_views.PasswordResetDoneView):
    template_name = "shop/password_reset_done.html"


class PasswordResetConfirmView(_SeeOther, auth_views.PasswordResetConfirmView):
    """The e-mailed link: "Password", "Confirm password", "Set password" (an invalid or used
    link says so and offers a new one)."""

    template_name = "shop/password_reset_confirm.html"
    form_class = SetPasswordForm
    success_url = reverse_lazy("password-reset-complete")


class PasswordResetCompleteView(auth_views.PasswordResetCompleteView):
    template_name = "shop/password_reset_complete.html"


class PasswordChangeView(_SeeOther, auth_views.PasswordChangeView):
    """`/accounts/password-change/` (logged in): the session stays logged in afterwards."""

    template_name = "shop/password_change.html"
    form_class = PasswordChangeForm
    success_url = reverse_lazy("password-change-done")


class PasswordChangeDoneView(auth_views.PasswordChangeDoneView):
    template_name = "shop/password_change_done.html"
