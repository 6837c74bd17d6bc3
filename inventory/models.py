"""Products, their stock and the reservation flags that hold it."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils.translation import pgettext_lazy


class Product(models.Model):
    """A sellable article, addressed by its sku; its price is snapshotted onto order lines."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    sku = models.CharField(max_length=64)
    name = models.CharField(max_length=200)
    price = models.DecimalField(max_digits=12, decimal_places=2)
    currency = models.CharField(max_length=3)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["sku"], name="inventory_product_sku_uniq"),
            models.CheckConstraint(
                condition=Q(price__gte=0), name="inventory_product_price_non_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.sku} {self.name}"


class StockItem(models.Model):
    """Units of one product on hand and how many of them reservations hold.

    `on_hand` counts sellable units not yet committed to confirmed orders;
    `reserved` the units held by reservation flags. Both change only through
    conditional UPDATEs in `inventory.services`; the database refuses any
    state where reservations exceed what is on hand.
    """

    product = models.OneToOneField(Product, on_delete=models.PROTECT, related_name="stock")
    on_hand = models.IntegerField(default=0)
    reserved = models.IntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(reserved__gte=0), name="inventory_stock_reserved_non_negative"
            ),
            models.CheckConstraint(
                condition=Q(on_hand__gte=F("reserved")),
                name="inventory_stock_on_hand_covers_reserved",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.product_id}: {self.on_hand} on hand, {self.reserved} reserved"

    @property
    def available(self) -> int:
        return self.on_hand - self.reserved


class Reservation(models.Model):
    """The reservation flag of one order line: units of one stock item held for it.

    While `held`, its `quantity` is counted in `StockItem.reserved`. It leaves
    `held` exactly once, by a conditional UPDATE on this row in the same
    transaction as the counter change: `committed` (the units left `on_hand`
    and `reserved` together: sold), `released` (declined, cancelled,
    refused) or `expired` (the shopper did not decide in time).
    `expires_at` is set only while an order awaits the shopper's decision;
    a flag whose payment outcome is unknown never expires.
    """

    class State(models.TextChoices):
        HELD = "held", pgettext_lazy("reservation state", "Held")
        COMMITTED = "committed", pgettext_lazy("reservation state", "Committed")
        RELEASED = "released", pgettext_lazy("reservation state", "Released")
        EXPIRED = "expired", pgettext_lazy("reservation state", "Expired")

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    stock = models.ForeignKey(StockItem, on_delete=models.PROTECT, related_name="reservations")
    quantity = models.IntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.HELD)
    expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(quantity__gt=0), name="inventory_reservation_quantity_positive"
            ),
            models.CheckConstraint(
                condition=Q(state__in=["held", "committed", "released", "expired"]),
                name="inventory_reservation_state_valid",
            ),
            models.CheckConstraint(
                condition=Q(state="held", resolved_at__isnull=True)
                | (~Q(state="held") & Q(resolved_at__isnull=False)),
                name="inventory_reservation_resolved_at_matches_state",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.quantity} of stock {self.stock_id} ({self.state})"


class StockAdjustment(models.Model):
    """One staff stock adjustment made through the admin's "Adjust stock" form.

    `form_scope` is the form's owner and key as rendered (the stock item as shown,
    inventory.admin_forms.stock_form_key): inserted first, in the
    transaction that changes the stock, so one form shown adjusts once for
    the row's whole life, also after its request key was purged
    (docs/idempotency.md, "Business scopes that outlive request keys").
    """

    id = models.BigAutoField(primary_key=True)
    stock = models.ForeignKey(StockItem, on_delete=models.PROTECT, related_name="adjustments")
    delta = models.IntegerField(null=True, blank=True)
    set_to = models.IntegerField(null=True, blank=True)
    reason = models.CharField(max_length=500, blank=True, default="")
    by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    form_scope = models.CharField(max_length=255)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["form_scope"], name="inventory_stockadjustment_form_scope_uniq"
            ),
            models.CheckConstraint(
                condition=Q(delta__isnull=False, set_to__isnull=True)
                | Q(delta__isnull=True, set_to__isnull=False),
                name="inventory_stockadjustment_one_of_delta_set",
            ),
        ]

    def __str__(self) -> str:
        change = f"delta {self.delta:+d}" if self.delta is not None else f"set to {self.set_to}"
        return f"stock {self.stock_id}: {change}"
