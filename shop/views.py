"""The storefront's pages: plain Django views over the API's services and keyed operations.

Every form answers Post/Redirect/Get: a 303 to the page that shows the
outcome, or the form again with a clear message. The keyed forms (checkout,
the decision on a short order) run through `idempotency.views.idempotent_form`
under the storefront's own operation names (shop/checkout.py).
"""

from __future__ import annotations

import functools
import math
from decimal import Decimal
from typing import cast

from django.contrib import messages
from django.contrib.auth import login as auth_login
from django.contrib.auth import logout as auth_logout
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import LoginView, redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.errors import ApplicationError, InvalidRequest, NotFound
from core.money import shop_currency
from idempotency.keys import key_lookup
from idempotency.models import STARTED
from idempotency.views import idempotent_form
from inventory import selectors as inventory_selectors
from inventory.models import Product
from orders import operations as order_operations
from orders import returns as order_returns
from orders import selectors as order_selectors
from orders import tracking
from orders.models import CompensationStep, ReturnLine, Shipment
from orders.services import LineRequest
from orders.states import OrderStatus
from payments import selectors as payment_selectors

from . import cart as carts
from . import checkout, history, loyalty, services, words
from . import returns as shop_returns
from .api.throttles import login_wait
from .forms import PAYMENT_METHODS, CheckoutForm, QuantityForm, ReturnForm, SignupForm


def see_other(url: str) -> HttpResponseRedirect:
    response = HttpResponseRedirect(url)
    response.status_code = 303
    return response


def form_refusal(request: HttpRequest, exc: ApplicationError) -> HttpResponse:
    """A keyed form the request-key machinery refused (in use, reused, malformed key)."""
    text = {
        "idempotency_key_in_use": "This form is being sent already. Wait a moment, then open "
        "your orders to see the result.",
        "idempotency_key_reused": "This form was already sent with other details. Your orders "
        "show what became of it; open the form again to start over.",
        "idempotency_key_missing": "This form is out of date. Open it again and resend it.",
        "idempotency_key_invalid": "This form is out of date. Open it again and resend it.",
    }.get(exc.code, exc.detail)
    response = render(
        request,
        "shop/form_refusal.html",
        {"message": text, "title": exc.default_title()},
        status=exc.status,
    )
    for name, value in exc.headers.items():
        response[name] = value
    return response


def _problem_text(code: str | None) -> str | None:
    if not code:
        return None
    return words.PROBLEMS.get(code, "Something went wrong; nothing was charged twice.")


# --- Catalog and cart ---------------------------------------------------------


@require_GET
def catalog(request: HttpRequest) -> HttpResponse:
    products = inventory_selectors.product_list().order_by("name", "sku")
    return render(request, "shop/catalog.html", {"products": products})


def _product_or_404(sku: str):
    try:
        return inventory_selectors.product_get(sku=sku)
    except NotFound:
        raise Http404("No such product.") from None


@require_http_methods(["GET", "POST"])
def product_page(request: HttpRequest, sku: str) -> HttpResponse:
    product = _product_or_404(sku)
    cart = carts.cart_for(user=request.user) if request.user.is_authenticated else None
    form = QuantityForm()
    status = 200
    if request.method == "POST":
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        assert cart is not None  # the shopper is logged in
        form = QuantityForm(request.POST)
        if form.is_valid():
            try:
                version = int(request.POST.get("cart_version", ""))
                carts.cart_add(
                    cart=cart,
                    version=version,
                    sku=product.sku,
                    quantity=form.cleaned_data["quantity"],
                )
            except (ValueError, carts.CartChanged):
                messages.warning(
                    request,
                    "Your cart changed since this page was shown (in another tab?), so "
                    "nothing was added. Check your cart, then add the item again.",
                )
                return see_other(request.path)
            messages.success(
                request, f"Added {form.cleaned_data['quantity']} × {product.name} to your cart."
            )
            return see_other("/cart/")
        status = 400
    context = {"product": product, "form": form, "cart": cart}
    return render(request, "shop/product.html", context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def cart_page(request: HttpRequest) -> HttpResponse:
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
        return see_other("/cart/")
    checkout.checkout_follow_up(cart=cart)
    cart.refresh_from_db()
    items = carts.cart_items(cart=cart)
    return render(
        request,
        "shop/cart.html",
        {"cart": cart, "items": items, "total": carts.cart_total(items)},
    )


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
        return see_other("/cart/")
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
    if response.status_code == 303 and response["Location"].startswith("/checkout/"):
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
        row = key_lookup(owner_id=request.user.pk, key=key.key)
        if row is None or row.recovery_point == STARTED:
            return _checkout_page(request, form=form, problem="cart_changed", status=409)
    if not form.is_valid():
        return _checkout_page(request, form=form, status=400)
    items = carts.cart_items(cart=cart)
    if version == cart.version:
        if not items:
            messages.info(request, "Your cart is empty: add something first.")
            return see_other("/cart/")
        if any(item.product is None for item in items):
            messages.error(request, "An item in your cart is no longer sold; remove it first.")
            return see_other("/cart/")
    data = form.cleaned_data
    order_operations.order_place_keyed(
        run=key.claim(),
        present=checkout.checkout_redirect,
        user=request.user,
        # A product is None only under a key past STARTED (refused above otherwise),
        # whose resumed run never reads the lines.
        lines=[
            LineRequest(product=cast(Product, item.product), quantity=item.quantity)
            for item in items
        ],
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


@login_required
@require_GET
def order_list(request: HttpRequest) -> HttpResponse:
    orders = (
        order_selectors.order_list_for_user(user=request.user)
        # login_required: an authenticated User; the stubs cannot narrow request.user.
        .filter(owner=request.user)  # type: ignore[misc]
        .order_by("-number")[:100]
    )
    return render(
        request,
        "shop/orders.html",
        {"orders": orders, "problem_text": _problem_text(request.GET.get("problem"))},
    )


def _order_context(request: HttpRequest, order) -> dict:
    names = dict(
        inventory_selectors.product_list()
        .filter(sku__in=[line.sku for line in order.line_list])
        .values_list("sku", "name")
    )
    payment = order_selectors.order_payment_summary(order=order)
    shipments = []
    for shipment in Shipment.objects.filter(order_id=order.id).order_by("created_at", "id"):
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
        "deciding": order.status == OrderStatus.AWAITING_DECISION,
        "declined": order.status == OrderStatus.PAYMENT_FAILED,
    }


def _order_returns(order, names: dict[str, str]) -> list[dict]:
    """The order's returns, oldest first, with their lines and compensation steps."""
    found = order_returns.returns_of_order(order_id=order.id)
    ids = [r.id for r in found]
    lines: dict = {}
    for line in ReturnLine.objects.filter(order_return_id__in=ids).order_by("id"):
        lines.setdefault(line.order_return_id, []).append((line, names.get(line.sku, line.sku)))
    steps: dict = {}
    for step in CompensationStep.objects.filter(order_return_id__in=ids).order_by("position"):
        steps.setdefault(step.order_return_id, []).append(step)
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
    """The pending order's status block, polled by htmx; once settled, the whole page reloads."""
    order = _own_order(request, order_id)
    response = render(request, "shop/_order_status.html", _order_context(request, order))
    if order.status != OrderStatus.PAYMENT_PENDING:
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


@login_required
@require_GET
def account_page(request: HttpRequest) -> HttpResponse:
    balance, _version = loyalty.loyalty_get(user=request.user)
    purchases = list(history.history_for_user(user=request.user)[:100])
    context = {"balance": balance, "purchases": purchases, "currency": shop_currency()}
    return render(request, "shop/account.html", context)


@login_required
@require_POST
def account_delete(request: HttpRequest) -> HttpResponse:
    if request.POST.get("confirm") != "yes":
        messages.error(request, "Tick the box to confirm that you want to delete your account.")
        return see_other("/account/")
    # login_required: an authenticated User; the stubs cannot narrow request.user.
    services.user_anonymise(user=request.user)  # type: ignore[arg-type]
    auth_logout(request)
    messages.success(request, "Your account was deleted. Your orders stay on record, anonymised.")
    return see_other("/")


def _safe_next(request: HttpRequest) -> str:
    target = request.POST.get("next") or request.GET.get("next") or "/"
    if url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return target
    return "/"


@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return see_other("/")
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
            messages.success(request, f"Welcome, {user.username}! Your account is ready.")
            return see_other(_safe_next(request))
    status = 400 if form.is_bound and form.errors else 200
    return render(
        request, "shop/signup.html", {"form": form, "next": _safe_next(request)}, status=status
    )


class ShopLoginView(LoginView):
    template_name = "shop/login.html"
    redirect_authenticated_user = True

    def post(self, request, *args, **kwargs):
        # Throttled like POST /api/v1/auth/token/, in the same buckets (per
        # username and per address), before the password is even checked.
        wait = login_wait(request, username=str(request.POST.get("username", "")))
        if wait is not None:
            seconds = max(1, math.ceil(wait))
            response = self.render_to_response(
                self.get_context_data(
                    form=self.get_form_class()(request),
                    throttled=f"Too many log-in attempts. Try again in {seconds} seconds.",
                ),
                status=429,
            )
            response["Retry-After"] = str(seconds)
            return response
        return super().post(request, *args, **kwargs)

    def form_valid(self, form):
        response = super().form_valid(form)
        response.status_code = 303
        return response


@require_http_methods(["GET", "POST"])
def logout_page(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        auth_logout(request)
        messages.success(request, "You are logged out.")
        return see_other("/")
    return render(request, "shop/logout.html")
