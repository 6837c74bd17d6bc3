from django.apps import AppConfig


class PaymentsConfig(AppConfig):
    name = "payments"

    def ready(self) -> None:
        # The admin's refund decisions ask first; their confirmations are keyed and answer
        # with a redirect (idempotency.admin_actions.keyed_action).
        from idempotency.admin_actions import register_keyed_actions

        from .admin import ADMIN_REFUND_ACCEPT_PROVIDER, ADMIN_REFUND_FAILED, ADMIN_REFUND_OUTSIDE

        register_keyed_actions(
            ADMIN_REFUND_OUTSIDE, ADMIN_REFUND_FAILED, ADMIN_REFUND_ACCEPT_PROVIDER
        )
