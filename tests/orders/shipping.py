"""Helpers of the shipment and tracking tests: confirmed orders and shipments, made directly."""

from __future__ import annotations

from orders.models import Order, Shipment
from orders.services import order_payment_record
from orders.shipments import ShipmentLineRequest, shipment_create


def confirm(order: Order) -> Order:
    """Record a captured payment for a `payment_pending` order: confirmed, flags committed."""
    return order_payment_record(order_id=order.id, succeeded=True)


def ship(order: Order, lines: dict[str, int] | None = None, **kwargs) -> Shipment:
    requests = None
    if lines is not None:
        requests = [ShipmentLineRequest(sku=sku, quantity=q) for sku, q in lines.items()]
    return shipment_create(
        order_id=order.id,
        lines=requests,
        carrier=kwargs.get("carrier"),
        tracking_number=kwargs.get("tracking_number"),
    )
