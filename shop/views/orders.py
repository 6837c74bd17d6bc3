"""The shopper's orders: the list, an order's page, its decisions and its return form.

An order's page and its polled status block; the decision on a short order
and the cancellation of a confirmed one (keyed, shop/checkout.py); the return
form (keyed, shop/returns.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.errors import NotFound
from idempotency.views import idempotent_form
from inventory import selectors as inventory_selectors
from orders import operations as order_operations
from orders import returns as order_returns
from orders import selectors as order_selectors
from orders import tracking
from orders.states import OrderStatus
from payments import selectors as payment_selectors

from .. import checkout, words
from .. import returns as shop_returns
from ..forms import PAYMENT_METHODS, ReturnForm
from .common import form_refusal, problem_text, refuse_couriers

ORDERS_PAGE = 20  # orders per page of /orders/


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
        "problem_text": problem_text(request.GET.get("problem")),
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
    for shipment in order_selectors.shipments_of_order(order_id=order.id):
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
        "refunded": payment.amount_refunded > 0,
        "refunds": list(payment_selectors.refunds_of_payment(payment_id=order.payment_id)),
        "returns": _order_returns(order, names),
        "method_label": dict(PAYMENT_METHODS).get(order.payment_method, order.payment_method),
        "hint": (
            _("Your items are on their way.")
            if order.fulfillment == "shipped" and order.status in checkout.KEPT
            else str(words.ORDER_STATUS_HINT.get(order.status, ""))
        ),
        "shipments": shipments,
        "problem_text": problem_text(request.GET.get("problem")),
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
        for return_id, found_lines in order_selectors.return_lines_of(return_ids=ids).items()
    }
    steps = order_selectors.return_steps_of(return_ids=ids)
    return [
        {"return": r, "lines": lines.get(r.id, []), "steps": steps.get(r.id, [])} for r in found
    ]


@login_required
@require_GET
def order_page(request: HttpRequest, order_id: str) -> HttpResponse:
    order = _own_order(request, order_id)
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
        response["HX-Refresh"] = "true"
    return response


@login_required
@require_POST
@refuse_couriers
def order_confirm(request: HttpRequest, order_id: str) -> HttpResponse:
    return _decide(request, order_id, _confirm_submit)


def _decide(
    request: HttpRequest, order_id: str, submit: Callable[..., HttpResponse]
) -> HttpResponse:
    """A keyed decision on the shopper's own order. The cart follows the order in the
    transaction that keeps or ends it (shop.cart.cart_order_decided), not here."""
    order = _own_order(request, order_id)
    return submit(request, order=order)


@idempotent_form(operation=checkout.CONFIRM, refusal=form_refusal)
def _confirm_submit(request: HttpRequest, *, key, order) -> None:
    order_operations.order_confirm_keyed(
        run=key.claim(), present=checkout.decision_redirect, order_id=order.id
    )


@login_required
@require_POST
@refuse_couriers
def order_cancel(request: HttpRequest, order_id: str) -> HttpResponse:
    return _decide(request, order_id, _cancel_submit)


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
    context["problem_text"] = problem_text(request.GET.get("problem"))
    context["any_returnable"] = any(returnable for _line, _name, returnable in form.lines)
    return render(request, "shop/return.html", context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
@refuse_couriers
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
        form_scope=key.scope,
    )
    return None
