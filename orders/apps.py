from django.apps import AppConfig


class OrdersConfig(AppConfig):
    name = "orders"

    def ready(self) -> None:
        from idempotency.operations import register_operation, single_phase_resume

        from . import operations
        from .api import presenters

        # The completer drives keys abandoned mid-way (see orders/operations.py)
        # and stores what the API would have: the API's presenters. A caller
        # with other answers (a storefront form) registers its own operation
        # names with its own presenter.
        register_operation(
            operations.CREATE, resume=operations.order_resume, present=presenters.order_created
        )
        register_operation(
            operations.CONFIRM, resume=operations.order_resume, present=presenters.order_confirmed
        )
        register_operation(
            operations.CANCEL, resume=single_phase_resume, present=presenters.order_cancelled
        )
        register_operation(
            operations.SHIPMENT_CREATE,
            resume=single_phase_resume,
            present=presenters.shipment_created,
        )
        register_operation(
            operations.REFUND_CREATE,
            resume=single_phase_resume,
            present=presenters.refund_created,
        )
        # The admin's refund form (orders/admin/order.py) answers with redirects.
        from .admin import order as orders_admin

        register_operation(
            orders_admin.ADMIN_REFUND_CREATE,
            resume=single_phase_resume,
            present=orders_admin.refund_redirect,
        )
        # Returns (orders/returns.py): one-phase keyed runs, the API's answers.
        register_operation(
            operations.RETURN_CREATE,
            resume=single_phase_resume,
            present=presenters.return_created,
        )
        register_operation(
            operations.RETURN_RECEIVE,
            resume=single_phase_resume,
            present=presenters.return_received,
        )
        # The admin's "Create shipment" form (orders/admin/forms.py) answers with redirects.
        from .admin import forms as admin_forms

        register_operation(
            admin_forms.ADMIN_SHIPMENT_CREATE,
            resume=single_phase_resume,
            present=admin_forms.shipment_redirect,
        )
        # The admin's return and cancel forms answer with redirects.
        from .admin import compensation as admin_compensation

        for name, present in (
            (admin_compensation.ADMIN_RETURN_RECEIVE, admin_compensation.return_redirect),
            (admin_compensation.ADMIN_RETURN_RETRY, admin_compensation.return_redirect),
            (admin_compensation.ADMIN_ORDER_CANCEL, admin_compensation.order_redirect),
        ):
            register_operation(name, resume=single_phase_resume, present=present)
        # The bulk "Mark received" confirmation (idempotency.admin_actions.keyed_action).
        from idempotency.admin_actions import register_keyed_actions

        register_keyed_actions(admin_compensation.ADMIN_RETURNS_RECEIVE)
