"""Staff views of the catalog, its stock counters and the reservation flags holding them.

Stock counters and flags change only by conditional UPDATEs in
`inventory.services` (a counter and its flags in one transaction, see
docs/checkout.md): their admins are read-only. Stock is adjusted through
the keyed stock endpoint or its admin twin, "Adjust stock"
(inventory/admin_forms.py).
"""

import functools

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.translation import gettext_lazy

from core.admin import ReadOnlyAdmin
from core.errors import ApplicationError
from core.money import check_currency, shop_currency

from .admin_forms import stock_adjust_view
from .models import Product, Reservation, StockItem


class ProductForm(forms.ModelForm):
    """The currency is a choice of the shop's, checked as the API checks it (check_currency)."""

    currency = forms.ChoiceField(choices=())

    class Meta:
        model = Product
        fields = ["sku", "name", "price", "currency"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        currency = self.fields["currency"]
        assert isinstance(currency, forms.ChoiceField)
        currency.choices = [(shop_currency(), shop_currency())]
        currency.initial = shop_currency()

    def clean_currency(self):
        currency = self.cleaned_data["currency"]
        try:
            check_currency(currency)
        except ApplicationError as exc:
            raise ValidationError(exc.detail) from None
        return currency


class StockInline(admin.StackedInline):
    model = StockItem
    can_delete = False
    readonly_fields = ("on_hand", "reserved")


@admin.register(Product)
class ProductAdmin(admin.ModelAdmin):
    form = ProductForm
    list_display = ("sku", "name", "price", "currency")
    search_fields = ("sku", "name")
    inlines = [StockInline]


@admin.register(StockItem)
class StockItemAdmin(ReadOnlyAdmin):
    list_display = ("sku", "name", "on_hand", "reserved", "available", "updated_at")
    search_fields = ("product__sku", "product__name")
    list_select_related = ("product",)
    ordering = ("product__sku",)

    def get_urls(self):
        view = self.admin_site.admin_view(functools.partial(stock_adjust_view, self))
        return [
            path("<path:object_id>/adjust/", view, name="inventory_stockitem_adjust"),
            *super().get_urls(),
        ]

    @admin.display(description=gettext_lazy("sku"), ordering="product__sku")
    def sku(self, stock):
        return stock.product.sku

    @admin.display(description=gettext_lazy("name"), ordering="product__name")
    def name(self, stock):
        return stock.product.name

    @admin.display(description=gettext_lazy("available"))
    def available(self, stock):
        return stock.available


@admin.register(Reservation)
class ReservationAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "sku",
        "order_number",
        "quantity",
        "state",
        "expires_at",
        "created_at",
        "resolved_at",
    )
    fields = (
        "id",
        "sku",
        "order_link",
        "stock",
        "quantity",
        "state",
        "expires_at",
        "created_at",
        "resolved_at",
    )
    readonly_fields = ("id", "sku", "order_link")
    list_filter = ("state", "created_at")
    # `=`: exact sku and order number, the way staff quote them.
    search_fields = ("=stock__product__sku", "=order_line__order__number")
    search_help_text = gettext_lazy("Sku or order number (exact).")
    # The flag's line is a reverse one-to-one: joined, not one query per row.
    list_select_related = ("stock__product", "order_line__order")
    ordering = ("-created_at",)
    show_full_result_count = False

    @admin.display(description=gettext_lazy("sku"), ordering="stock__product__sku")
    def sku(self, reservation):
        return reservation.stock.product.sku

    @admin.display(description=gettext_lazy("order"), ordering="order_line__order__number")
    def order_number(self, reservation):
        line = getattr(reservation, "order_line", None)
        return line.order.number if line else "-"

    @admin.display(description=gettext_lazy("order"))
    def order_link(self, reservation):
        line = getattr(reservation, "order_line", None)
        if line is None:
            return "-"
        url = reverse("admin:orders_order_change", args=[line.order_id])
        return format_html('<a href="{}">{}</a>', url, line.order.number)
