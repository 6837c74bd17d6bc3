"""Staff views of orders: read-only, since every change goes through a service.

Orders, lines, events and reservation flags move only by conditional
UPDATEs that write their event and outbox rows in the same transaction
(docs/checkout.md); a hand edit here would skip all of that, so the admin
shows them and changes nothing.
"""

import hashlib
from decimal import Decimal

from django import forms
from django.contrib import admin
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.translation import gettext, gettext_lazy

from core.admin import ReadOnlyAdmin, ReadOnlyInline, require_permission
from core.admin_export import CsvExportMixin
from core.money import format_money, shop_currency
from idempotency.admin_actions import refusal_message
from idempotency.keys import Reply, Result, keyed_operation
from idempotency.views import idempotent_form
from payments import selectors as payment_selectors
from payments.states import PaymentStatus

from .. import operations, permissions, tracking
from ..models import Order, OrderEvent, OrderLine, Shipment, ShipmentLine
from ..states import LineStatus, OrderStatus
from .compensation import CancellationStepInline, CancelOrderMixin, ReturnInline
from .forms import ORDER_CSV_COLUMNS, ShipmentFormMixin, order_form_answer, order_form_submit

# The admin's refund form: its own operation name, so an abandoned key is
# completed (forgotten: one phase) with the form's redirect, never the API's JSON.
ADMIN_REFUND_CREATE = "admin.refund.create"


def refund_form_key(order, *, after: str = "") -> str:
    """The refund form's key: the order and its refunds as they are when the form is rendered.

    Not random: two tabs (or two renders) of the same order's form in the same
    state carry the same key, so submitting both is one refund (the second is
    a replay, or 422 `idempotency_key_reused` with other values). A refund made
    moves the state, so the next form gets a new key; `after` (a refused
    submission's key) gives the form shown after a refusal a fresh one.
    After the key is purged, the refund id derived from the form's scope
    (`operations.form_refund_id`) keeps it one refund.
    """
    count = payment_selectors.refunds_of_payment(payment_id=order.payment_id).count()
    reserved = order.payment.refund_reserved if order.payment_id else 0
    seed = f"{order.id}:{count}:{reserved}:{after}"
    return "admin-refund-" + hashlib.sha256(seed.encode()).hexdigest()[:32]


@keyed_operation(ADMIN_REFUND_CREATE)
def refund_redirect(result: Result, *, order_id=None, form_key: str = "", request=None) -> Reply:
    """The admin form's answer: 303 to the order page; a refusal back to the form, with its code.

    With the request (not the completer's copy) a refusal is also an admin
    message with the problem's title (idempotency.admin_actions.refusal_message).
    """
    if result.refusal is not None and request is not None:
        refusal_message(request, result.refusal)
    if result.refusal is None:
        order_id = result.value.order_id
        return Reply(
            status=303, headers={"Location": reverse("admin:orders_order_change", args=[order_id])}
        )
    query = urlencode({"problem": result.refusal.detail, "after": form_key})
    url = (
        reverse("admin:orders_order_refund", args=[order_id])
        if order_id
        else reverse("admin:index")
    )
    return Reply(status=303, headers={"Location": f"{url}?{query}"})


class RefundForm(forms.Form):
    amount = forms.DecimalField(max_digits=12, decimal_places=2, min_value=0.01)
    reason = forms.CharField(max_length=500)


@idempotent_form(operation=ADMIN_REFUND_CREATE)
def _refund_submit(request, order, form, *, key):
    return order_form_submit(
        request,
        order,
        form,
        key=key,
        keyed=operations.refund_create_keyed,
        redirect=refund_redirect,
        values=lambda data, key: {
            "amount": data["amount"],
            "reason": data["reason"],
            "requested_by": request.user,
            "refund_id": operations.form_refund_id(key.scope),
        },
    )


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

    @admin.display(description=gettext_lazy("reservation"))
    def reservation_link(self, line):
        if line.reservation is None:
            return "-"
        url = reverse("admin:inventory_reservation_change", args=[line.reservation.pk])
        return format_html('<a href="{}">{}</a>', url, line.reservation.pk)

    @admin.display(description=gettext_lazy("flag state"))
    def reservation_state(self, line):
        return line.reservation.get_state_display() if line.reservation else "-"

    @admin.display(description=gettext_lazy("flag units"))
    def reservation_quantity(self, line):
        return line.reservation.quantity if line.reservation else "-"

    @admin.display(description=gettext_lazy("flag expires at"))
    def reservation_expires_at(self, line):
        return line.reservation.expires_at if line.reservation else None

    @admin.display(description=gettext_lazy("flag resolved at"))
    def reservation_resolved_at(self, line):
        return line.reservation.resolved_at if line.reservation else None


class OrderEventInline(ReadOnlyInline):
    model = OrderEvent
    fields = ["created_at", "kind", "line", "from_words", "to_words", "data"]
    readonly_fields = fields
    ordering = ["created_at", "id"]

    @staticmethod
    def _status_words(event, status):
        # An event of a line moves a line status, else an order status: their labels.
        if status is None:
            return "-"
        choices = LineStatus if event.line_id is not None else OrderStatus
        return choices(status).label if status in choices.values else status

    @admin.display(description=gettext_lazy("from status"))
    def from_words(self, event):
        return self._status_words(event, event.from_status)

    @admin.display(description=gettext_lazy("to status"))
    def to_words(self, event):
        return self._status_words(event, event.to_status)

    def get_queryset(self, request):
        # `line` is shown as its str (sku, quantity, status): fetch it with the event.
        return super().get_queryset(request).select_related("line")


class ShipmentInline(ReadOnlyInline):
    """The order's shipments; each links to its page (lines and tracking events)."""

    model = Shipment
    fields = ["shipment_link", "carrier", "tracking_number", "created_at"]
    readonly_fields = fields
    ordering = ["created_at", "id"]

    @admin.display(description=gettext_lazy("shipment"))
    def shipment_link(self, shipment):
        url = reverse("admin:orders_shipment_change", args=[shipment.pk])
        return format_html('<a href="{}">{}</a>', url, shipment.pk)


class RefundFormMixin(admin.ModelAdmin):
    """The orders' admin: the "Refund" action and its keyed form."""

    def has_refund_permission(self, request, obj=None) -> bool:
        """Refunds move money: the custom `orders.refund_order` permission, not "change order"."""
        return request.user.has_perm(permissions.REFUND)

    @admin.action(description=gettext_lazy("Refund (amount and reason)"), permissions=["refund"])
    def refund(self, request, queryset):
        orders = list(queryset.values_list("id", flat=True)[:2])
        if len(orders) != 1:
            self.message_user(
                request, gettext_lazy("Select exactly one order to refund."), level="warning"
            )
            return None
        return HttpResponseRedirect(reverse("admin:orders_order_refund", args=[orders[0]]))

    def get_urls(self):
        view = self.admin_site.admin_view(self.refund_view)
        return [
            path("<path:object_id>/refund/", view, name="orders_order_refund"),
            *super().get_urls(),
        ]

    def refund_view(self, request, object_id):
        """The refund form: GET renders it with a fresh key; POST is keyed (one refund per key)."""
        if not request.user.is_staff:
            return HttpResponseRedirect(reverse("admin:login"))
        require_permission(self.has_refund_permission(request))
        order = get_object_or_404(Order.objects.select_related("payment"), pk=object_id)
        form = RefundForm(request.POST or None) if request.method == "POST" else RefundForm()
        answer, key = order_form_answer(
            request,
            _refund_submit,
            order,
            form,
            fresh=lambda: refund_form_key(order, after=request.GET.get("after", "")),
        )
        if answer is not None:
            return answer
        payment = order.payment
        captured = payment.amount_captured if payment else Decimal(0)
        reserved = payment.refund_reserved if payment else Decimal(0)
        return TemplateResponse(
            request,
            "admin/orders/order/refund.html",
            {
                **self.admin_site.each_context(request),
                "title": gettext("Refund order {number}").format(number=order.number),
                "opts": self.model._meta,
                "order": order,
                "form": form,
                "key": key,
                "problem": request.GET.get("problem"),
                "currency": shop_currency(),
                "captured": format_money(captured),
                "reserved": format_money(reserved),
                "refundable": format_money(captured - reserved),
            },
        )


@admin.register(Order)
class OrderAdmin(
    ShipmentFormMixin, CancelOrderMixin, RefundFormMixin, CsvExportMixin, ReadOnlyAdmin
):
    """One order's page: read-only rows, and the staff actions each mixin adds ("Create
    shipment", "Cancel order", "Refund") with its own page and URL."""

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
    search_help_text = gettext_lazy("Order number (exact), or the shopper's username or e-mail.")
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
    inlines = [
        OrderLineInline,
        OrderEventInline,
        ShipmentInline,
        ReturnInline,
        CancellationStepInline,
    ]
    actions = ["refund", "cancel_order"]
    # "Export CSV" (core.admin_export): the list as filtered, streamed.
    csv_columns = ORDER_CSV_COLUMNS
    csv_filename = "orders.csv"

    def get_fieldsets(self, request, obj=None):
        return [*super().get_fieldsets(request, obj), ("Refunds", {"fields": ["refunds"]})]

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), "refunds"]

    # Refunds hang off the payment, not the order: shown as a read-only table.
    @admin.display(description=gettext_lazy("refunds (whatever started them)"))
    def refunds(self, order):
        if order.payment_id is None:
            return "-"
        rows = list(payment_selectors.refunds_of_payment(payment_id=order.payment_id))
        if not rows:
            return "-"
        body = format_html_join(
            "",
            '<tr class="refund"><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td>'
            "<td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    reverse("admin:payments_refund_change", args=[r.pk]),
                    r.pk,
                    f"{r.amount} {r.currency}",
                    r.get_status_display(),
                    r.get_origin_display(),
                    r.reason,
                    r.attempts,
                    r.last_error,
                )
                for r in rows
            ),
        )
        heads = format_html_join(
            "",
            "<th>{}</th>",
            (
                (head,)
                for head in (
                    gettext_lazy("refund"),
                    gettext_lazy("amount"),
                    gettext_lazy("status"),
                    gettext_lazy("origin"),
                    gettext_lazy("reason"),
                    gettext_lazy("attempts"),
                    gettext_lazy("last error"),
                )
            ),
        )
        return format_html(
            "<table><thead><tr>{}</tr></thead><tbody>{}</tbody></table>", heads, body
        )

    # None until the order goes to payment ("none" in the API's body).
    @admin.display(description=gettext_lazy("payment status"))
    def payment_status(self, order):
        return order.payment.get_status_display() if order.payment else PaymentStatus.NONE.label

    @admin.display(description=gettext_lazy("captured"))
    def payment_amount_captured(self, order):
        return order.payment.amount_captured if order.payment else "-"

    @admin.display(description=gettext_lazy("refunded"))
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
    search_help_text = gettext_lazy("Tracking number or order number (exact).")
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

    @admin.display(description=gettext_lazy("tracking: received"))
    def tracking_counts(self, shipment):
        summary = tracking.tracking_summary(shipment_id=shipment.pk)
        return format_html(
            "{} events, {} duplicates received, {} suspicious event ids "
            "(same event id, different payload)",
            summary.distinct,
            summary.duplicates_received,
            summary.suspicious,
        )

    @admin.display(
        description=gettext_lazy("tracking events (each event id once, first received wins)")
    )
    def tracking_events(self, shipment):
        events = list(tracking.tracking_events(shipment_id=shipment.pk)[:500])
        if not events:
            return "-"
        rows = format_html_join(
            "",
            '<tr class="tracking-event"><td>{}</td><td>{}</td><td>{}</td><td>{}</td>'
            "<td>{}</td></tr>",
            (
                (
                    e.occurred_at.isoformat(),
                    e.event_id,
                    e.get_status_display(),
                    e.location or "",
                    e.received_at,
                )
                for e in events
            ),
        )
        heads = format_html_join(
            "",
            "<th>{}</th>",
            (
                (head,)
                for head in (
                    gettext_lazy("occurred at"),
                    gettext_lazy("event id"),
                    gettext_lazy("status"),
                    gettext_lazy("location"),
                    gettext_lazy("received at"),
                )
            ),
        )
        return format_html(
            "<table><thead><tr>{}</tr></thead><tbody>{}</tbody></table>", heads, rows
        )
