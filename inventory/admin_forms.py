"""The admin's "Adjust stock": a keyed form, as `POST /products/{sku}/stock/`.

The same service (`stock_adjust`: one conditional UPDATE that never takes
on hand below what reservations hold) in the same one-phase keyed run, under
the admin's own operation name, with the reason written to the stock item's
admin history in the same transaction (`stock_adjust_by_staff`). The form's
key names the stock item as shown (on hand, reserved, last change): a double
click or a second tab of one form adjusts once, also after the key is purged
(the `StockAdjustment` row keeps the form's scope). A refusal
(409 `stock_below_reserved`, 422 `stock_limit_exceeded`) comes back to the
form as an admin message with the problem's title. Needs
`inventory.change_stockitem`.
"""

from __future__ import annotations

import functools

from django import forms
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.translation import gettext, gettext_lazy

from core.money import shop_currency
from idempotency.admin_actions import admin_form_refusal, refusal_message, state_key
from idempotency.keys import Reply, Result, keyed_operation
from idempotency.views import FORM_FIELD, form_redirect, idempotent_form

from . import operations, permissions
from .models import StockItem
from .services import MAX_ON_HAND

ADMIN_STOCK_ADJUST = "admin.stock.adjust"
ADJUST_PERMISSION = permissions.ADJUST_STOCK  # as the API (docs/security.md)


def stock_form_key(stock: StockItem, *, after: str = "") -> str:
    return state_key("stock", stock.pk, stock.on_hand, stock.reserved, stock.updated_at, after)


@keyed_operation(ADMIN_STOCK_ADJUST)
def stock_redirect(result: Result, *, stock_id=None, form_key: str = "", request=None) -> Reply:
    """303 to the stock item's page; a refusal back to the form (fresh key) with its title."""
    if result.refusal is None:
        stock = result.value
        return form_redirect(
            reverse("admin:inventory_stockitem_change", args=[stock.pk]),
            message=gettext("{sku}: {on_hand} on hand, {available} available.").format(
                sku=stock.product.sku, on_hand=stock.on_hand, available=stock.available
            ),
        )
    if request is not None:
        refusal_message(request, result.refusal)
    if stock_id is None:  # the completer's copy: no form to go back to
        return Reply(status=303, headers={"Location": reverse("admin:index")})
    url = reverse("admin:inventory_stockitem_adjust", args=[stock_id])
    return Reply(status=303, headers={"Location": f"{url}?{urlencode({'after': form_key})}"})


class StockAdjustForm(forms.Form):
    """Exactly one of the API's `delta` and `set`, and why."""

    MODES = [("delta", "Change by (delta, e.g. -2 or 10)"), ("set", "Set on hand to")]

    mode = forms.ChoiceField(choices=MODES, widget=forms.RadioSelect, initial="delta")
    quantity = forms.IntegerField(min_value=-MAX_ON_HAND, max_value=MAX_ON_HAND)
    reason = forms.CharField(
        max_length=500, help_text=gettext_lazy("Kept in the stock item's history.")
    )

    def clean(self):
        super().clean()
        data = self.cleaned_data
        if data.get("mode") == "set" and data.get("quantity") is not None and data["quantity"] < 0:
            self.add_error("quantity", "On hand cannot be negative.")
        return data


@idempotent_form(operation=ADMIN_STOCK_ADJUST, refusal=admin_form_refusal)
def _adjust_submit(request, stock, form, *, key):
    if key is None or not form.is_valid():
        return None  # re-rendered by the caller: nothing claimed
    quantity = form.cleaned_data["quantity"]
    is_delta = form.cleaned_data["mode"] == "delta"
    operations.stock_adjust_by_staff_keyed(
        run=key.claim(),
        present=functools.partial(
            stock_redirect, stock_id=stock.pk, form_key=key.key, request=request
        ),
        sku=stock.product.sku,
        delta=quantity if is_delta else None,
        set_to=None if is_delta else quantity,
        reason=form.cleaned_data["reason"],
        by=request.user,
        form_scope=key.scope,
    )


def stock_adjust_view(modeladmin, request, object_id):
    """GET: the form with the counters and a key naming them; POST: keyed, adjusts once."""
    if not request.user.has_perm(ADJUST_PERMISSION):
        raise PermissionDenied
    stock = get_object_or_404(StockItem.objects.select_related("product"), pk=object_id)
    form = StockAdjustForm(request.POST if request.method == "POST" else None)
    if request.method == "POST":
        answer = _adjust_submit(request, stock, form)
        if answer is not None:
            return answer
    key = (
        request.POST.get(FORM_FIELD)
        if request.method == "POST"
        else stock_form_key(stock, after=request.GET.get("after", ""))
    )
    return TemplateResponse(
        request,
        "admin/inventory/stockitem/adjust.html",
        {
            **modeladmin.admin_site.each_context(request),
            "title": gettext("Adjust stock: {sku}").format(sku=stock.product.sku),
            "opts": modeladmin.model._meta,
            "stock": stock,
            "form": form,
            "key": key,
            "currency": shop_currency(),
        },
    )
