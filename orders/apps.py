from django.apps import AppConfig


class OrdersConfig(AppConfig):
    name = "orders"

    def ready(self) -> None:
        from idempotency.keys import register_operation

        from . import checkout, shipments

        # The completer drives keys abandoned mid-way (see orders/checkout.py).
        register_operation(checkout.CREATE, resume=checkout.order_resume)
        register_operation(checkout.CONFIRM, resume=checkout.order_resume)
        register_operation(checkout.CANCEL, resume=checkout.single_phase_resume)
        register_operation(shipments.SHIPMENT_CREATE, resume=shipments.shipment_create_resume)
