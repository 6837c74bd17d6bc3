from django.contrib import admin

from .models import Product, StockItem


class StockInline(admin.StackedInline):
    model = StockItem
    can_delete = False
    readonly_fields = ("on_hand", "reserved")


@admin.register(Product)
class ProductAdmin(admin.ModelAdmin):
    list_display = ("sku", "name", "price", "currency")
    search_fields = ("sku", "name")
    inlines = [StockInline]
