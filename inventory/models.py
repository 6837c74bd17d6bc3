"""Products, their stock and the reservation flags that hold it."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils.translation import gettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _


class Product(models.Model):
    """A sellable article, addressed by its sku; its price is snapshotted onto order lines."""

    id = models.UUIDField(
        primary_key=True, default=uuid.uuid4, editable=False, verbose_name=_("id")
    )
    sku = models.CharField(max_length=64, verbose_name=_("sku"))
    name = models.CharField(max_length=200, verbose_name=_("name"))
    price = models.DecimalField(max_digits=12, decimal_places=2, verbose_name=_("price"))
    currency = models.CharField(max_length=3, verbose_name=_("currency"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))

    class Meta:
        verbose_name = _("product")
        verbose_name_plural = _("products")
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

    product = models.OneToOneField(
        Product, on_delete=models.PROTECT, related_name="stock", verbose_name=_("product")
    )
    on_hand = models.IntegerField(default=0, verbose_name=_("on hand"))
    reserved = models.IntegerField(default=0, verbose_name=_("reserved"))
    updated_at = models.DateTimeField(auto_now=True, verbose_name=_("updated at"))

    class Meta:
        verbose_name = _("stock item")
        verbose_name_plural = _("stock items")
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
        return gettext("{product}: {on_hand} on hand, {reserved} reserved").format(
            product=self.product_id, on_hand=self.on_hand, reserved=self.reserved
        )

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

    id = models.UUIDField(
        primary_key=True, default=uuid.uuid4, editable=False, verbose_name=_("id")
    )
    stock = models.ForeignKey(
        StockItem, on_delete=models.PROTECT, related_name="reservations", verbose_name=_("stock")
    )
    quantity = models.IntegerField(verbose_name=_("quantity"))
    state = models.CharField(
        max_length=16, choices=State.choices, default=State.HELD, verbose_name=_("state")
    )
    expires_at = models.DateTimeField(null=True, blank=True, verbose_name=_("expires at"))
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))
    resolved_at = models.DateTimeField(null=True, blank=True, verbose_name=_("resolved at"))

    class Meta:
        verbose_name = _("reservation")
        verbose_name_plural = _("reservations")
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
        return gettext("{quantity} of stock {stock} ({state})").format(
            quantity=self.quantity, stock=self.stock_id, state=self.state
        )


class StockAdjustment(models.Model):
    """One staff stock adjustment made through the admin's "Adjust stock" form.

    `form_scope` is the form's owner and key as rendered (the stock item as shown,
    inventory.admin_forms.stock_form_key): inserted first, in the
    transaction that changes the stock, so one form shown adjusts once for
    the row's whole life, also after its request key was purged
    (docs/idempotency.md, "Business scopes that outlive request keys").
    """

    id = models.BigAutoField(primary_key=True, verbose_name=_("id"))
    stock = models.ForeignKey(
        StockItem, on_delete=models.PROTECT, related_name="adjustments", verbose_name=_("stock")
    )
    delta = models.IntegerField(null=True, blank=True, verbose_name=_("delta"))
    set_to = models.IntegerField(null=True, blank=True, verbose_name=_("set to"))
    reason = models.CharField(max_length=500, blank=True, default="", verbose_name=_("reason"))
    by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("by"),
    )
    form_scope = models.CharField(max_length=255, verbose_name=_("form scope"))
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))

    class Meta:
        verbose_name = _("stock adjustment")
        verbose_name_plural = _("stock adjustments")
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
        change = (
            gettext("delta {delta:+d}").format(delta=self.delta)
            if self.delta is not None
            else gettext("set to {set_to}").format(set_to=self.set_to)
        )
        return gettext("stock {stock}: {change}").format(stock=self.stock_id, change=change)
