"""Staff views of orders: read-only, since every change goes through a service.

Orders, lines, events and reservation flags move only by conditional
UPDATEs that write their event and outbox rows in the same transaction
(docs/checkout.md); a hand edit here would skip all of that, so the admin
shows them and changes nothing.
"""

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from core.admin import ReadOnlyAdmin, ReadOnlyInline

from . import tracking
from .models import Order, OrderEvent, OrderLine, Shipment, ShipmentLine


class OrderLineInline(ReadOnlyInline):
    """The lines, each with its reservation flag (a flag hangs off its line, not the order)."""

    model = OrderLine
    fields = [
        "position",
        "sku",
        "unit_price",
        "quantity_requested",
        "quantity_confirmed",
        "quantity_shipped",
        "quantity_returned",
        "status",
        "reservation_link",
        "reservation_state",
        "reservation_quantity",
        "reservation_expires_at",
        "reservation_resolved_at",
    ]
    readonly_fields = fields
    ordering = ["position"]

    def get_queryset(self, request):
        # One query for every line and its flag, not one more per line.
        return super().get_queryset(request).select_related("reservation")

    @admin.display(description="reservation")
    def reservation_link(self, line):
        if line.reservation is None:
            return "-"
        url = reverse("admin:inventory_reservation_change", args=[line.reservation.pk])
        return format_html('<a href="{}">{}</a>', url, line.reservation.pk)

    @admin.display(description="flag state")
    def reservation_state(self, line):
        return line.reservation.state if line.reservation else "-"

    @admin.display(description="flag units")
    def reservation_quantity(self, line):
        return line.reservation.quantity if line.reservation else "-"

    @admin.display(description="flag expires at")
    def reservation_expires_at(self, line):
        return line.reservation.expires_at if line.reservation else None

    @admin.display(description="flag settled at")
    def reservation_resolved_at(self, line):
        return line.reservation.resolved_at if line.reservation else None


class OrderEventInline(ReadOnlyInline):
    model = OrderEvent
    fields = ["created_at", "kind", "line", "from_status", "to_status", "data"]
    readonly_fields = fields
    ordering = ["created_at", "id"]

    def get_queryset(self, request):
        # `line` is shown as its str (sku, quantity, status): fetch it with the event.
        return super().get_queryset(request).select_related("line")


class ShipmentInline(ReadOnlyInline):
    """The order's shipments; each links to its page (lines and tracking events)."""

    model = Shipment
    fields = ["shipment_link", "carrier", "tracking_number", "created_at"]
    readonly_fields = fields
    ordering = ["created_at", "id"]

    @admin.display(description="shipment")
    def shipment_link(self, shipment):
        url = reverse("admin:orders_shipment_change", args=[shipment.pk])
        return format_html('<a href="{}">{}</a>', url, shipment.pk)


@admin.register(Order)
class OrderAdmin(ReadOnlyAdmin):
    list_display = [
        "number",
        "owner",
        "status",
        "fulfillment",
        "total",
        "currency",
        "payment__status",
        "on_shortage",
        "reservation_expires_at",
        "created_at",
    ]
    list_filter = ["status", "fulfillment", "on_shortage", "created_at"]
    # `=number`: an exact match on the human number, which staff read off a
    # receipt or an e-mail; the owner's name and e-mail by substring.
    search_fields = ["=number", "owner__username", "owner__email"]
    search_help_text = "Order number (exact), or the shopper's username or e-mail."
    list_select_related = ["owner", "payment"]
    ordering = ["-number"]
    show_full_result_count = False
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "number",
                    "id",
                    "owner",
                    "status",
                    "fulfillment",
                    "on_shortage",
                    "total",
                    "currency",
                    "reservation_expires_at",
                    "created_at",
                    "updated_at",
                ]
            },
        ),
        (
            "Payment",
            {
                "fields": [
                    "payment_method",
                    "payment",
                    "payment_status",
                    "payment_amount_captured",
                    "payment_amount_refunded",
                ]
            },
        ),
        ("Shipping", {"fields": ["shipping_address"]}),
    ]
    readonly_fields = [
        "id",
        "number",
        "payment_status",
        "payment_amount_captured",
        "payment_amount_refunded",
    ]
    inlines = [OrderLineInline, OrderEventInline, ShipmentInline]

    # None until the order goes to payment ("none" in the API's body).
    @admin.display(description="payment status")
    def payment_status(self, order):
        return order.payment.status if order.payment else "none"

    @admin.display(description="captured")
    def payment_amount_captured(self, order):
        return order.payment.amount_captured if order.payment else "-"

    @admin.display(description="refunded")
    def payment_amount_refunded(self, order):
        return order.payment.amount_refunded if order.payment else "-"


class ShipmentLineInline(ReadOnlyInline):
    model = ShipmentLine
    fields = ["sku", "quantity", "order_line"]
    readonly_fields = fields
    ordering = ["id"]


@admin.register(Shipment)
class ShipmentAdmin(ReadOnlyAdmin):
    """A shipment, its lines and its tracking events through the deduplicating read path.

    The raw tracking rows contain duplicates (docs/shipments.md); they are
    never listed here, only `orders.tracking`'s deduplicated view and its
    counts (duplicates received, suspicious event ids).
    """

    list_display = ["id", "order", "carrier", "tracking_number", "created_at"]
    list_select_related = ["order"]
    search_fields = ["=tracking_number", "=order__number"]
    search_help_text = "Tracking number or order number (exact)."
    ordering = ["-created_at"]
    fields = [
        "id",
        "order",
        "carrier",
        "tracking_number",
        "created_at",
        "tracking_counts",
        "tracking_events",
    ]
    readonly_fields = fields
    inlines = [ShipmentLineInline]

    @admin.display(description="tracking: received")
    def tracking_counts(self, shipment):
        summary = tracking.tracking_summary(shipment_id=shipment.pk)
        return format_html(
            "{} events, {} duplicates received, {} suspicious event ids "
            "(same event id, different payload)",
            summary.distinct,
            summary.duplicates_received,
            summary.suspicious,
        )

    @admin.display(description="tracking events (each event id once, first received wins)")
    def tracking_events(self, shipment):
        events = list(tracking.tracking_events(shipment_id=shipment.pk)[:500])
        if not events:
            return "-"
        rows = format_html_join(
            "",
            '<tr class="tracking-event"><td>{}</td><td>{}</td><td>{}</td><td>{}</td>'
            "<td>{}</td></tr>",
            (
                (e.occurred_at.isoformat(), e.event_id, e.status, e.location or "", e.received_at)
                for e in events
            ),
        )
        return format_html(
            "<table><thead><tr><th>occurred at</th><th>event id</th><th>status</th>"
            "<th>location</th><th>received at</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )
