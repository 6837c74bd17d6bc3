"""Staff changes on an order's own page: "Create shipment", and the orders' CSV export.

"Create shipment" is a keyed form, as `POST /orders/{id}/shipments/`: the
same keyed run (`operations.shipment_create_keyed`, one phase, the same
service and refusals) under the admin's own operation name, so an abandoned
key is completed with the form's redirect. The form's key names the
order's lines as shown (`shipment_form_key`): a double click, a refresh or a
second tab of the same form ships once (the second is a replay; with other
values, 422 `idempotency_key_reused`, told as a message); after the key is
purged, the shipment's `form_scope` keeps it one shipment. A refusal
(422 `exceeds_unshipped`, 409 `invalid_state` …) comes back to the form as an
admin message with the problem's title. The page needs `orders.change_order`,
as the API does (orders.permissions.SHIP).

The order page's buttons ("Create shipment", "Refund", "Cancel order") are in
`templates/admin/orders/order/change_form.html`; "Refund" and "Cancel order"
lead to their confirmation pages (orders.admin.order, orders.admin.compensation).
The two keyed forms on an order ("Create shipment" here, "Refund" in
orders.admin.order) share their POST: `order_form_answer` runs the keyed
submit or names the key the rendered form carries, and `order_form_submit`
claims the key and runs the keyed operation on the order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import urlencode
from django.utils.translation import gettext

from idempotency.admin_actions import admin_form_refusal, refusal_message, state_key
from idempotency.keys import Reply, Result, keyed_operation
from idempotency.views import FORM_FIELD, KeyRequest, form_redirect, idempotent_form

from .. import operations, permissions
from ..models import Order, OrderLine
from ..shipments import ShipmentLineRequest
from ..states import LineStatus

ADMIN_SHIPMENT_CREATE = "admin.shipment.create"
SHIP_PERMISSION = permissions.SHIP  # docs/security.md "One permission map"

# The orders' CSV export (core.admin_export.CsvExportMixin on OrderAdmin).
ORDER_CSV_COLUMNS = [
    ("number", "number"),
    ("id", "id"),
    ("created_at", "created_at"),
    ("status", "status"),
    ("fulfillment", "fulfillment"),
    ("owner", "owner__username"),
    ("email", "owner__email"),
    ("total", "total"),
    ("currency", "currency"),
    ("payment_status", "payment__status"),
    ("captured", "payment__amount_captured"),
    ("refunded", "payment__amount_refunded"),
]


def unshipped(line: OrderLine) -> int:
    """Units of a line confirmed and not yet shipped (what a shipment may take)."""
    if line.status != LineStatus.CONFIRMED:
        return 0
    return line.quantity_confirmed - line.quantity_shipped


def shipment_form_key(order: Order, lines: list[OrderLine], *, after: str = "") -> str:
    """The form's key: the order's status and each line's shipped units as shown."""
    shown = [f"{line.pk}={line.quantity_shipped}" for line in lines]
    return state_key("shipment", order.id, order.status, *shown, after)


@keyed_operation(ADMIN_SHIPMENT_CREATE)
def shipment_redirect(result: Result, *, order_id=None, form_key: str = "", request=None) -> Reply:
    """303 to the order's page; a refusal back to the form (fresh key) with its title."""
    if result.refusal is None:
        shipment = result.value
        return form_redirect(
            reverse("admin:orders_order_change", args=[shipment.order_id]),
            message=gettext("Shipment {id} created.").format(id=shipment.pk),
        )
    if request is not None:
        refusal_message(request, result.refusal)
    if order_id is None:  # the completer's copy: no form to go back to
        return Reply(status=303, headers={"Location": reverse("admin:index")})
    url = reverse("admin:orders_order_ship", args=[order_id])
    return Reply(status=303, headers={"Location": f"{url}?{urlencode({'after': form_key})}"})


class ShipmentForm(forms.Form):
    """Units per confirmed line (0: not in this parcel), carrier and tracking number."""

    carrier = forms.CharField(max_length=64, required=False)
    tracking_number = forms.CharField(max_length=128, required=False)

    def __init__(self, *args, lines: list[OrderLine], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.order_lines = lines
        for line in lines:
            # No upper bound of the line's own: the service decides (422 exceeds_unshipped),
            # as it does for the API, against the lines as they are when it runs.
            self.fields[self.line_field(line)] = forms.IntegerField(
                min_value=0,
                max_value=1000,
                initial=unshipped(line),
                label=gettext("{sku} (units to ship; {unshipped} unshipped)").format(
                    sku=line.sku, unshipped=unshipped(line)
                ),
            )

    @staticmethod
    def line_field(line: OrderLine) -> str:
        return f"ship-{line.sku}"

    def line_rows(self):
        """(line, bound field) pairs for the template's table."""
        return [(line, self[self.line_field(line)]) for line in self.order_lines]

    def clean(self):
        super().clean()
        data = self.cleaned_data
        lines = [
            ShipmentLineRequest(sku=line.sku, quantity=data[self.line_field(line)])
            for line in self.order_lines
            if data.get(self.line_field(line))
        ]
        if not lines and not self.errors:
            raise forms.ValidationError("Ship at least one unit.")
        data["lines"] = lines
        return data


def order_form_submit(
    request,
    order: Order,
    form: forms.Form,
    *,
    key: KeyRequest | None,
    keyed: Callable[..., object],
    redirect: Callable[..., Reply],
    values: Callable[[dict, KeyRequest], dict],
) -> None:
    """The POST of a keyed form on an order's page (inside `idempotent_form`).

    Not a POST or an invalid form: None, and the view renders the form again
    with nothing claimed. Otherwise the key is claimed and the keyed run
    `keyed` goes ahead on the order with `values(cleaned_data, key)`, its
    answer presented by `redirect` (303 to the order, or back to the form with
    this key as `after`); `idempotent_form` returns that answer.
    """
    if key is None or not form.is_valid():
        return None  # re-rendered by the caller: nothing claimed
    keyed(
        run=key.claim(),
        present=functools.partial(redirect, order_id=order.id, form_key=key.key, request=request),
        order_id=order.id,
        **values(form.cleaned_data, key),
    )
    return None


def order_form_answer(request, submit, order: Order, form: forms.Form, *, fresh: Callable[[], str]):
    """(the keyed POST's answer or None, the key the rendered form carries).

    A POST runs `submit` (an `idempotent_form` view); when it re-renders the
    form (invalid), the form keeps the key it was posted with; a GET gets
    `fresh()`, the key naming the order's state as shown.
    """
    if request.method == "POST":
        answer = submit(request, order, form)
        if answer is not None:
            return answer, ""
        return None, request.POST.get(FORM_FIELD)
    return None, fresh()


@idempotent_form(operation=ADMIN_SHIPMENT_CREATE, refusal=admin_form_refusal)
def _shipment_submit(request, order, form, *, key):
    return order_form_submit(
        request,
        order,
        form,
        key=key,
        keyed=operations.shipment_create_keyed,
        redirect=shipment_redirect,
        values=lambda data, key: {
            "lines": data["lines"],
            "carrier": data["carrier"] or None,
            "tracking_number": data["tracking_number"] or None,
            "form_scope": key.scope,
        },
    )


class ShipmentFormMixin(admin.ModelAdmin):
    """The orders' admin: the "Create shipment" page (its button is on the order page)."""

    def get_urls(self):
        view = self.admin_site.admin_view(self.shipment_view)
        return [
            path("<path:object_id>/ship/", view, name="orders_order_ship"),
            *super().get_urls(),
        ]

    def shipment_view(self, request, object_id):
        """GET: the form with the order's lines and a key naming them; POST: keyed, ships once."""
        if not request.user.has_perm(SHIP_PERMISSION):
            raise PermissionDenied
        order = get_object_or_404(Order, pk=object_id)
        lines = list(order.lines.filter(status=LineStatus.CONFIRMED).order_by("position"))
        form = ShipmentForm(request.POST if request.method == "POST" else None, lines=lines)
        answer, key = order_form_answer(
            request,
            _shipment_submit,
            order,
            form,
            fresh=lambda: shipment_form_key(order, lines, after=request.GET.get("after", "")),
        )
        if answer is not None:
            return answer
        return TemplateResponse(
            request,
            "admin/orders/order/shipment.html",
            {
                **self.admin_site.each_context(request),
                "title": gettext("Create shipment: order {number}").format(number=order.number),
                "opts": self.model._meta,
                "order": order,
                "form": form,
                "key": key,
                "unshipped": sum(unshipped(line) for line in lines),
            },
        )
