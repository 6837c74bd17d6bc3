"""Orders, their lines and the event row every status change writes."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from core.due import DuePolicy, DueWork, due_index
from inventory.models import Product, Reservation

from .states import (
    CompensationKind,
    Fulfillment,
    LineStatus,
    OnShortage,
    OrderStatus,
    ReturnStatus,
    StepName,
    StepStatus,
    TrackingStatus,
)

# Created by migration 0001; numbers are human-readable and never reused.
ORDER_NUMBER_SEQUENCE = "orders_order_number_seq"
# One order per business scope (Order.scope).
SCOPE_CONSTRAINT = "orders_order_scope_uniq"


def _choices_check(field: str, choices: type[models.TextChoices], name: str):
    return models.CheckConstraint(condition=Q(**{f"{field}__in": choices.values}), name=name)


class Order(models.Model):
    """A shopper's order: its lines hold reservation flags until it is paid or let go."""

    # Not a field: set by services.order_cancel for its caller (True: this call started it).
    cancel_started: bool
    # Not a field: set by services.order_hold, the lines it inserted (as inserted).
    held_lines: "list[OrderLine]"

    id = models.UUIDField(
        primary_key=True, default=uuid.uuid4, editable=False, verbose_name=_("id")
    )
    number = models.BigIntegerField(
        db_default=models.Func(
            template=f"nextval('{ORDER_NUMBER_SEQUENCE}')", output_field=models.BigIntegerField()
        ),
        editable=False,
        verbose_name=_("number"),
    )
    # The (owner, -number) index below serves both the FK and the shopper's list.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="orders",
        db_index=False,
        verbose_name=_("owner"),
    )
    status = models.CharField(max_length=32, choices=OrderStatus.choices, verbose_name=_("status"))
    fulfillment = models.CharField(
        max_length=32,
        choices=Fulfillment.choices,
        default=Fulfillment.UNFULFILLED,
        verbose_name=_("fulfillment"),
    )
    on_shortage = models.CharField(
        max_length=16, choices=OnShortage.choices, verbose_name=_("on shortage")
    )
    payment_method = models.CharField(max_length=64, verbose_name=_("payment method"))
    shipping_address = models.JSONField(verbose_name=_("shipping address"))
    currency = models.CharField(max_length=3, verbose_name=_("currency"))
    # Σ unit_price × quantity_confirmed: what is (or would be) captured.
    total = models.DecimalField(max_digits=14, decimal_places=2, verbose_name=_("total"))
    reservation_expires_at = models.DateTimeField(
        null=True, blank=True, verbose_name=_("reservation expires at")
    )
    # Created when the order goes to payment (reference "order-<number>").
    payment = models.OneToOneField(
        "payments.Payment",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="order",
        verbose_name=_("payment"),
    )
    # The business scope the order was placed from, opaque to orders (the storefront's
    # "cart:<id>:<version>"): one order per scope for the order's whole life, key or no
    # key (docs/checkout.md, "One order per cart version"). None: an API order.
    scope = models.CharField(
        max_length=128, null=True, blank=True, editable=False, verbose_name=_("scope")
    )
    # The language the order was placed in (the storefront page's; an API order's is
    # LANGUAGE_CODE): the shopper's e-mails are written in it (docs/storefront.md, "Languages").
    # The column's own default lets an INSERT that does not name it (a host still on the
    # code before it, a raw statement) place an order.
    language = models.CharField(
        max_length=16,
        default=settings.LANGUAGE_CODE,
        db_default=settings.LANGUAGE_CODE,
        editable=False,
        verbose_name=_("language"),
    )
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))
    updated_at = models.DateTimeField(db_default=Now(), verbose_name=_("updated at"))

    class Meta:
        # Refunding moves money: its own permission, apart from "change order"
        # (cancelling), so a role may cancel without refunding (docs/compensation.md).
        verbose_name = _("order")
        verbose_name_plural = _("orders")
        permissions = [("refund_order", "Can refund orders")]
        constraints = [
            models.UniqueConstraint(fields=["number"], name="orders_order_number_uniq"),
            # Decides "already ordered" (orders.services.order_hold); API orders have none.
            models.UniqueConstraint(
                fields=["scope"], condition=Q(scope__isnull=False), name=SCOPE_CONSTRAINT
            ),
            models.CheckConstraint(
                condition=Q(total__gte=0), name="orders_order_total_non_negative"
            ),
            _choices_check("status", OrderStatus, "orders_order_status_valid"),
            _choices_check("fulfillment", Fulfillment, "orders_order_fulfillment_valid"),
            _choices_check("on_shortage", OnShortage, "orders_order_on_shortage_valid"),
            models.CheckConstraint(
                condition=~Q(status=OrderStatus.AWAITING_DECISION)
                | Q(reservation_expires_at__isnull=False),
                name="orders_order_awaiting_decision_expires",
            ),
        ]
        indexes = [
            # INCLUDE id: a shopper's list pages over (id, number) by an index-only scan.
            models.Index(
                fields=["owner", "-number"], include=["id"], name="orders_order_owner_number_idx"
            ),
            # The owner's orders of the last minute (orders.limits): a range of this
            # index, never the owner's whole history.
            models.Index(fields=["owner", "created_at"], name="orders_order_owner_created_idx"),
            models.Index(
                fields=["reservation_expires_at"],
                condition=Q(status="awaiting_decision"),
                name="orders_order_awaiting_idx",
            ),
            # A shopper's orders holding stock, earliest expiry first (orders.limits).
            models.Index(
                fields=["owner", "reservation_expires_at"],
                condition=Q(status__in=["awaiting_decision", "payment_pending"]),
                name="orders_order_owner_holding_idx",
            ),
        ]

    def __str__(self) -> str:
        return gettext("order {number} ({status})").format(number=self.number, status=self.status)


class OrderLine(models.Model):
    """One sku of an order, its price snapshotted when the order was placed."""

    order = models.ForeignKey(
        Order, on_delete=models.PROTECT, related_name="lines", verbose_name=_("order")
    )
    position = models.PositiveSmallIntegerField(verbose_name=_("position"))
    product = models.ForeignKey(
        Product, on_delete=models.PROTECT, related_name="+", verbose_name=_("product")
    )
    sku = models.CharField(max_length=64, verbose_name=_("sku"))
    unit_price = models.DecimalField(max_digits=12, decimal_places=2, verbose_name=_("unit price"))
    quantity_requested = models.IntegerField(verbose_name=_("quantity requested"))
    # The units this line holds or held for the order (0 when unavailable).
    quantity_confirmed = models.IntegerField(default=0, verbose_name=_("quantity confirmed"))
    quantity_shipped = models.IntegerField(default=0, verbose_name=_("quantity shipped"))
    quantity_returned = models.IntegerField(default=0, verbose_name=_("quantity returned"))
    status = models.CharField(max_length=16, choices=LineStatus.choices, verbose_name=_("status"))
    reservation = models.OneToOneField(
        Reservation,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="order_line",
        verbose_name=_("reservation"),
    )

    class Meta:
        verbose_name = _("order line")
        verbose_name_plural = _("order lines")
        constraints = [
            models.UniqueConstraint(fields=["order", "product"], name="orders_orderline_sku_uniq"),
            models.UniqueConstraint(
                fields=["order", "position"], name="orders_orderline_position_uniq"
            ),
            models.CheckConstraint(
                condition=Q(quantity_requested__gte=1, quantity_requested__lte=1000),
                name="orders_orderline_requested_range",
            ),
            models.CheckConstraint(
                condition=Q(quantity_confirmed__gte=0)
                & Q(quantity_confirmed__lte=F("quantity_requested")),
                name="orders_orderline_confirmed_range",
            ),
            models.CheckConstraint(
                condition=Q(quantity_returned__gte=0)
                & Q(quantity_returned__lte=F("quantity_shipped"))
                & Q(quantity_shipped__lte=F("quantity_confirmed")),
                name="orders_orderline_shipped_range",
            ),
            models.CheckConstraint(
                condition=Q(unit_price__gte=0), name="orders_orderline_unit_price_non_negative"
            ),
            _choices_check("status", LineStatus, "orders_orderline_status_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.sku} × {self.quantity_requested} ({self.status})"


class OrderEvent(models.Model):
    """One status change of an order or one of its lines, written in the change's transaction."""

    order = models.ForeignKey(
        Order, on_delete=models.PROTECT, related_name="events", verbose_name=_("order")
    )
    line = models.ForeignKey(
        OrderLine,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="events",
        verbose_name=_("line"),
    )
    kind = models.CharField(max_length=64, verbose_name=_("kind"))
    from_status = models.CharField(
        max_length=32, null=True, blank=True, verbose_name=_("from status")
    )
    to_status = models.CharField(max_length=32, verbose_name=_("to status"))
    data = models.JSONField(default=dict, blank=True, verbose_name=_("data"))
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))

    class Meta:
        verbose_name = _("order event")
        verbose_name_plural = _("order events")

    def __str__(self) -> str:
        return f"{self.kind}: {self.from_status} → {self.to_status}"


class Shipment(models.Model):
    """A parcel leaving the warehouse with some confirmed units of one order."""

    id = models.UUIDField(
        primary_key=True, default=uuid.uuid4, editable=False, verbose_name=_("id")
    )
    order = models.ForeignKey(
        Order, on_delete=models.PROTECT, related_name="shipments", verbose_name=_("order")
    )
    carrier = models.CharField(max_length=64, null=True, blank=True, verbose_name=_("carrier"))
    tracking_number = models.CharField(
        max_length=128, null=True, blank=True, verbose_name=_("tracking number")
    )
    # The admin form's owner and key as rendered: one shipment per form shown, for the
    # row's whole life (docs/idempotency.md, "Business scopes that outlive
    # request keys"); null for the API's shipments (request keys only).
    form_scope = models.CharField(
        max_length=255, null=True, blank=True, verbose_name=_("form scope")
    )
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))

    class Meta:
        verbose_name = _("shipment")
        verbose_name_plural = _("shipments")
        constraints = [
            models.UniqueConstraint(fields=["form_scope"], name="orders_shipment_form_scope_uniq"),
        ]

    def __str__(self) -> str:
        return gettext("shipment {id} of order {order}").format(id=self.id, order=self.order_id)


class ShipmentLine(models.Model):
    """Units of one order line in one shipment (their sum is the line's `quantity_shipped`)."""

    shipment = models.ForeignKey(
        Shipment, on_delete=models.PROTECT, related_name="lines", verbose_name=_("shipment")
    )
    order_line = models.ForeignKey(
        OrderLine,
        on_delete=models.PROTECT,
        related_name="shipment_lines",
        verbose_name=_("order line"),
    )
    sku = models.CharField(max_length=64, verbose_name=_("sku"))
    quantity = models.IntegerField(verbose_name=_("quantity"))

    class Meta:
        verbose_name = _("shipment line")
        verbose_name_plural = _("shipment lines")
        constraints = [
            models.UniqueConstraint(
                fields=["shipment", "order_line"], name="orders_shipmentline_line_uniq"
            ),
            models.CheckConstraint(
                condition=Q(quantity__gte=1), name="orders_shipmentline_quantity_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.sku} × {self.quantity}"


class TrackingEvent(models.Model):
    """One courier tracking event, stored exactly as received: duplicates included.

    Couriers deliver at least once, so the same `event_id` arrives several
    times; there is deliberately no uniqueness here. Every read goes through
    `orders.tracking` (the deduplicating read path); nothing else may use
    this model's manager (a test greps for it). `related_name="+"`: no
    `shipment.tracking_events` shortcut around that read path.
    """

    # The primary key is the order of receipt: the first received wins.
    id = models.BigAutoField(primary_key=True, verbose_name=_("id"))
    shipment = models.ForeignKey(
        Shipment, on_delete=models.PROTECT, related_name="+", verbose_name=_("shipment")
    )
    event_id = models.CharField(max_length=200, verbose_name=_("event id"))
    status = models.CharField(
        max_length=32, choices=TrackingStatus.choices, verbose_name=_("status")
    )
    occurred_at = models.DateTimeField(verbose_name=_("occurred at"))
    location = models.CharField(max_length=200, null=True, blank=True, verbose_name=_("location"))
    # The JSON object as parsed (compared for "suspicious" duplicates) and the bytes as sent.
    payload = models.JSONField(verbose_name=_("payload"))
    raw_body = models.TextField(verbose_name=_("raw body"))
    received_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("received by"),
    )
    received_at = models.DateTimeField(db_default=Now(), verbose_name=_("received at"))

    class Meta:
        verbose_name = _("tracking event")
        verbose_name_plural = _("tracking events")
        constraints = [
            _choices_check("status", TrackingStatus, "orders_trackingevent_status_valid"),
        ]
        indexes = [
            # DISTINCT ON (event_id) ... ORDER BY event_id, id per shipment.
            models.Index(fields=["shipment", "event_id", "id"], name="orders_tracking_dedup_idx"),
        ]

    def __str__(self) -> str:
        return gettext("{event_id} {status} at {occurred_at}").format(
            event_id=self.event_id, status=self.status, occurred_at=self.occurred_at
        )


class ReturnRequest(models.Model):
    """A shopper sending shipped units back (docs/compensation.md).

    `requested` is an open return: its units count against what the order's
    lines may still return. Receiving it (one conditional UPDATE
    requested → processing) moves its units into the lines'
    `quantity_returned` and inserts its compensation steps, in one
    transaction.
    """

    # Not fields: the lines and steps as prefetched or just created, and
    # whether this call started the return's compensation (returns.py).
    line_list: "list[ReturnLine]"
    step_list: "list[CompensationStep]"
    started: bool

    id = models.UUIDField(
        primary_key=True, default=uuid.uuid4, editable=False, verbose_name=_("id")
    )
    order = models.ForeignKey(
        Order, on_delete=models.PROTECT, related_name="returns", verbose_name=_("order")
    )
    status = models.CharField(
        max_length=20,
        choices=ReturnStatus.choices,
        default=ReturnStatus.REQUESTED,
        verbose_name=_("status"),
    )
    reason = models.CharField(max_length=500, blank=True, default="", verbose_name=_("reason"))
    # Σ unit_price × quantity of its lines: what its refund step refunds.
    refund_amount = models.DecimalField(
        max_digits=14, decimal_places=2, verbose_name=_("refund amount")
    )
    currency = models.CharField(max_length=3, verbose_name=_("currency"))
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("requested by"),
    )
    received_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("received by"),
    )
    received_at = models.DateTimeField(null=True, blank=True, verbose_name=_("received at"))
    completed_at = models.DateTimeField(null=True, blank=True, verbose_name=_("completed at"))
    # The storefront form's owner and key as rendered: one return per form shown, for
    # the row's whole life (docs/idempotency.md, "Business scopes that
    # outlive request keys"); null for the API's returns (request keys only).
    form_scope = models.CharField(
        max_length=255, null=True, blank=True, verbose_name=_("form scope")
    )
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))
    updated_at = models.DateTimeField(db_default=Now(), verbose_name=_("updated at"))

    class Meta:
        verbose_name = _("return request")
        verbose_name_plural = _("return requests")
        constraints = [
            _choices_check("status", ReturnStatus, "orders_return_status_valid"),
            models.UniqueConstraint(fields=["form_scope"], name="orders_return_form_scope_uniq"),
            models.CheckConstraint(
                condition=Q(refund_amount__gte=0), name="orders_return_refund_non_negative"
            ),
            models.CheckConstraint(
                condition=Q(status=ReturnStatus.REQUESTED) | Q(received_at__isnull=False),
                name="orders_return_received_at_set",
            ),
        ]
        indexes = [
            models.Index(fields=["order", "status"], name="orders_return_order_status_idx"),
        ]

    def __str__(self) -> str:
        return gettext("return {id} of order {order} ({status})").format(
            id=self.id, order=self.order_id, status=self.status
        )


class ReturnLine(models.Model):
    """Units of one order line in one return."""

    order_return = models.ForeignKey(
        ReturnRequest,
        on_delete=models.PROTECT,
        related_name="lines",
        verbose_name=_("order return"),
    )
    order_line = models.ForeignKey(
        OrderLine, on_delete=models.PROTECT, related_name="+", verbose_name=_("order line")
    )
    sku = models.CharField(max_length=64, verbose_name=_("sku"))
    quantity = models.IntegerField(verbose_name=_("quantity"))

    class Meta:
        verbose_name = _("return line")
        verbose_name_plural = _("return lines")
        constraints = [
            models.UniqueConstraint(
                fields=["order_return", "order_line"], name="orders_returnline_line_uniq"
            ),
            models.CheckConstraint(
                condition=Q(quantity__gte=1), name="orders_returnline_quantity_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.sku} × {self.quantity}"


class CompensationStep(DueWork):
    """One compensation step of a received return or a cancelled confirmed order (due work).

    One row per (return, step) or (cancelled order, step), inserted in the
    transaction that started the compensation; the unique constraints make
    a second set impossible. `status` mirrors the due-work columns for
    people (pending, running, done, failed); `done_at` and
    `needs_attention` are what the machinery reads. `after` names the step
    this one waits for (docs/compensation.md, "Order of the steps").
    """

    id = models.BigAutoField(primary_key=True, verbose_name=_("id"))
    kind = models.CharField(max_length=16, choices=CompensationKind.choices, verbose_name=_("kind"))
    order = models.ForeignKey(
        Order, on_delete=models.PROTECT, related_name="compensation_steps", verbose_name=_("order")
    )
    order_return = models.ForeignKey(
        ReturnRequest,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="steps",
        verbose_name=_("order return"),
    )
    name = models.CharField(max_length=16, choices=StepName.choices, verbose_name=_("name"))
    position = models.PositiveSmallIntegerField(verbose_name=_("position"))
    status = models.CharField(
        max_length=16,
        choices=StepStatus.choices,
        default=StepStatus.PENDING,
        verbose_name=_("status"),
    )
    after = models.CharField(
        max_length=16, choices=StepName.choices, blank=True, default="", verbose_name=_("after")
    )
    # The refund step's derived refund id (uuid5 of the return or cancellation).
    refund_id = models.UUIDField(null=True, blank=True, verbose_name=_("refund id"))
    detail = models.JSONField(default=dict, blank=True, verbose_name=_("detail"))
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))
    updated_at = models.DateTimeField(db_default=Now(), verbose_name=_("updated at"))

    class Meta:
        verbose_name = _("compensation step")
        verbose_name_plural = _("compensation steps")
        constraints = [
            models.UniqueConstraint(
                fields=["order_return", "name"],
                condition=Q(kind=CompensationKind.RETURN),
                name="orders_step_return_name_uniq",
            ),
            models.UniqueConstraint(
                fields=["order", "name"],
                condition=Q(kind=CompensationKind.CANCELLATION),
                name="orders_step_cancellation_name_uniq",
            ),
            models.CheckConstraint(
                condition=(Q(kind=CompensationKind.RETURN) & Q(order_return__isnull=False))
                | (Q(kind=CompensationKind.CANCELLATION) & Q(order_return__isnull=True)),
                name="orders_step_kind_matches_return",
            ),
            models.CheckConstraint(
                condition=(Q(status=StepStatus.DONE) & Q(done_at__isnull=False))
                | (~Q(status=StepStatus.DONE) & Q(done_at__isnull=True)),
                name="orders_step_done_matches_done_at",
            ),
            _choices_check("status", StepStatus, "orders_step_status_valid"),
            _choices_check("name", StepName, "orders_step_name_valid"),
        ]
        indexes = [
            due_index(name="orders_step_due_idx"),
            models.Index(fields=["order", "position"], name="orders_step_order_idx"),
        ]

    def __str__(self) -> str:
        return gettext("{kind} step {name} ({status})").format(
            kind=self.kind, name=self.name, status=self.status
        )

    @classmethod
    def due_policy(cls) -> DuePolicy:
        return DuePolicy.from_settings(
            "COMPENSATION",
            task="orders.compensation_step",
            attempt_lease=settings.COMPENSATION_ATTEMPT_LEASE,
        )
