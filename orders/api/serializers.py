"""Request validation and the answers' bodies, exactly as the contract spells them."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.fields import ClosedSerializer, StrictCharField, StrictIntegerField
from core.money import MoneyField, check_currency, format_money
from core.serializers import represented
from inventory import selectors as inventory_selectors
from payments.capture import SUPPORTED_METHODS

from .. import selectors
from ..services import LineRequest
from ..states import OnShortage, OrderStatus, StepStatus

MAX_LINES = 100


def repeated_sku_errors(skus: list[str]) -> dict[int, dict]:
    """Return DRF item errors (keyed by line index) for each sku seen before in `skus`."""
    errors: dict[int, dict] = {}
    seen: set[str] = set()
    for index, sku in enumerate(skus):
        if sku in seen:
            errors[index] = {"sku": ["This sku appears more than once."]}
        seen.add(sku)
    return errors


def sku_lines(lines: list[dict], make):
    """Return `make(sku=, quantity=)` per line, refusing a sku that appears twice (400)."""
    errors = repeated_sku_errors([line["sku"] for line in lines])
    if errors:
        # Item errors keyed by line index, as DRF gives them; the stubs want str keys.
        raise serializers.ValidationError(errors)  # type: ignore[arg-type]
    return [make(sku=line["sku"], quantity=line["quantity"]) for line in lines]


class OrderLineIn(ClosedSerializer):
    sku = StrictCharField(max_length=64)
    quantity = StrictIntegerField(min_value=1, max_value=1000)


class ShippingAddressIn(ClosedSerializer):
    name = StrictCharField(max_length=200)
    line1 = StrictCharField(max_length=200)
    line2 = StrictCharField(max_length=200, required=False, allow_blank=True)
    city = StrictCharField(max_length=100)
    region = StrictCharField(max_length=100, required=False, allow_blank=True)
    postal_code = StrictCharField(max_length=20)
    country = serializers.RegexField(
        r"^[A-Za-z]{2}$",
        error_messages={"invalid": "A two-letter ISO 3166 country code."},
    )

    def validate_country(self, value: str) -> str:
        return value.upper()


@extend_schema_field({"type": "string", "enum": sorted(SUPPORTED_METHODS)})
class PaymentMethodField(StrictCharField):
    """A payment method: one of the provider's test methods (the contract's table)."""


class OrderIn(ClosedSerializer):
    """POST /orders/ body. Products are looked up here, so an unknown sku is a 400."""

    # many=True makes a ListSerializer, which takes max_length; the stubs do not say so.
    lines = OrderLineIn(many=True, allow_empty=False, max_length=MAX_LINES)  # type: ignore[call-arg]
    on_shortage = serializers.ChoiceField(choices=OnShortage.choices, default=OnShortage.REJECT)
    payment_method = PaymentMethodField(max_length=64)
    shipping_address = ShippingAddressIn()
    expected_total = MoneyField(required=False)
    # Optional; when given it must be the shop's (422 currency_mismatch).
    currency = StrictCharField(required=False, min_length=3, max_length=3)

    def validate_payment_method(self, value: str) -> str:
        if value not in SUPPORTED_METHODS:
            raise serializers.ValidationError("Unknown payment method.")
        return value

    def validate_lines(self, lines: list[dict]) -> list[LineRequest]:
        skus = [line["sku"] for line in lines]
        products = inventory_selectors.products_by_sku(skus=skus)
        # Keyed by line index, as DRF reports item errors of a list.
        errors = repeated_sku_errors(skus)
        for index, sku in enumerate(skus):
            if index not in errors and sku not in products:
                errors[index] = {"sku": ["Unknown sku."]}
        if errors:
            raise serializers.ValidationError(errors)  # type: ignore[arg-type]  # as sku_lines'
        return [
            LineRequest(product=products[line["sku"]], quantity=line["quantity"]) for line in lines
        ]

    def validate(self, attrs: dict) -> dict:
        currency = attrs.pop("currency", None)
        if currency is not None:
            check_currency(currency)
        return attrs


class OrderLineOut(serializers.Serializer):
    sku = serializers.CharField()
    quantity_requested = serializers.IntegerField()
    quantity_confirmed = serializers.IntegerField()
    quantity_shipped = serializers.IntegerField()
    quantity_returned = serializers.IntegerField()
    status = serializers.CharField()
    unit_price = MoneyField()


class PaymentSummaryOut(serializers.Serializer):
    status = serializers.CharField()
    amount_captured = serializers.CharField()
    amount_refunded = serializers.CharField()


class CompensationStepOut(serializers.Serializer):
    name = serializers.CharField()
    status = serializers.CharField()
    attempts = serializers.IntegerField()
    last_error = serializers.CharField(allow_null=True)


class CancellationOut(serializers.Serializer):
    status = serializers.ChoiceField(choices=["processing", "completed", "needs_attention"])
    steps = CompensationStepOut(many=True)


class OrderOut(serializers.Serializer):
    id = serializers.UUIDField()
    number = serializers.IntegerField()
    status = serializers.CharField()
    fulfillment = serializers.CharField()
    lines = OrderLineOut(many=True, source=selectors.LINES_ATTR)
    total = MoneyField()
    currency = serializers.CharField()
    payment = serializers.SerializerMethodField()
    reservation_expires_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    # While the order is `cancelling`: its compensation's progress; null otherwise.
    cancellation = serializers.SerializerMethodField()

    @extend_schema_field(PaymentSummaryOut)
    def get_payment(self, order) -> dict:
        return payment_body(selectors.order_payment_summary(order=order))

    @extend_schema_field(CancellationOut(allow_null=True))
    def get_cancellation(self, order) -> dict | None:
        return cancellation_body(order)


def payment_body(summary: selectors.PaymentSummary) -> dict:
    """The order body's `payment` member: status and amounts in the shop currency."""
    return {
        "status": summary.status,
        "amount_captured": format_money(summary.amount_captured),
        "amount_refunded": format_money(summary.amount_refunded),
    }


def compensation_steps_body(steps) -> list[dict]:
    """The contract's `steps` of a return or cancellation: {name, status, attempts, last_error}."""
    return [
        {
            "name": step.name,
            "status": step.status,
            "attempts": step.attempts,
            "last_error": step.last_error or None,
        }
        for step in steps
    ]


def cancellation_body(order) -> dict | None:
    """The order body's `cancellation`: {status, steps} while the order is `cancelling`, else None.

    `needs_attention` when a step failed or waits for staff, `completed` when
    every step is done (the order is `cancelled` in the same transaction, so
    this is seen only by a read racing it), `processing` otherwise.
    """
    if order.status != OrderStatus.CANCELLING:
        return None
    steps = selectors.cancellation_steps_of(order_id=order.id)
    if any(step.needs_attention or step.status == StepStatus.FAILED for step in steps):
        status = "needs_attention"
    elif steps and all(step.done_at is not None for step in steps):
        status = "completed"
    else:
        status = "processing"
    return {"status": status, "steps": compensation_steps_body(steps)}


def order_body(order) -> dict:
    """Render the contract's order body (reading the lines if the order does not carry them)."""
    if not hasattr(order, selectors.LINES_ATTR):
        selectors.order_with_lines(order=order, lines=list(order.lines.all()))
    return represented(OrderOut, order)


class ShipmentLineOut(serializers.Serializer):
    sku = serializers.CharField()
    quantity = serializers.IntegerField()


class ShipmentOut(serializers.Serializer):
    id = serializers.UUIDField()
    order_id = serializers.UUIDField()
    lines = ShipmentLineOut(many=True, source="line_list")
    carrier = serializers.CharField(allow_null=True)
    tracking_number = serializers.CharField(allow_null=True)


def shipment_body(shipment) -> dict:
    """Render the contract's shipment body."""
    return dict(ShipmentOut(shipment).data)


class RefundIn(ClosedSerializer):
    """POST /orders/{id}/refunds/ body: a positive decimal string in the shop's currency."""

    amount = MoneyField()
    currency = StrictCharField(min_length=3, max_length=3)
    reason = StrictCharField(max_length=500)

    def validate_amount(self, value):
        if value <= 0:
            raise serializers.ValidationError("Must be positive.")
        return value

    def validate(self, attrs: dict) -> dict:
        check_currency(attrs.pop("currency"))
        return attrs


class RefundOut(serializers.Serializer):
    id = serializers.UUIDField()
    order_id = serializers.UUIDField()
    amount = MoneyField()
    currency = serializers.CharField()
    status = serializers.CharField()
    reason = serializers.CharField()


def refund_body(refund, *, order_id) -> dict:
    """Render the contract's refund body."""
    return {
        "id": str(refund.id),
        "order_id": str(order_id),
        "amount": MoneyField().to_representation(refund.amount),
        "currency": refund.currency,
        "status": refund.status,
        "reason": refund.reason,
    }


def return_body(order_return) -> dict:
    """The contract's return body: lines and steps read fresh (they change under the run)."""
    ids = [order_return.id]
    lines = selectors.return_lines_of(return_ids=ids).get(order_return.id, [])
    steps = selectors.return_steps_of(return_ids=ids).get(order_return.id, [])
    return {
        "id": str(order_return.id),
        "order_id": str(order_return.order_id),
        "status": order_return.status,
        "lines": [{"sku": line.sku, "quantity": line.quantity} for line in lines],
        "refund_amount": format_money(order_return.refund_amount),
        "currency": order_return.currency,
        "reason": order_return.reason,
        "steps": compensation_steps_body(steps),
    }
