"""The orders' admin (docs/admin.md): importing the package registers every model once.

- `order`: `OrderAdmin`, composed of the mixins below and its own "Refund"
  form (`RefundFormMixin`); `ShipmentAdmin`.
- `forms`: "Create shipment" (`ShipmentFormMixin`); the orders' CSV columns.
- `compensation`: returns, compensation steps, "Cancel order" (`CancelOrderMixin`).
"""

from .compensation import CompensationStepAdmin, ReturnRequestAdmin
from .order import OrderAdmin, ShipmentAdmin

__all__ = ["CompensationStepAdmin", "OrderAdmin", "ReturnRequestAdmin", "ShipmentAdmin"]
