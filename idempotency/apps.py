from django.apps import AppConfig


class IdempotencyConfig(AppConfig):
    name = "idempotency"
    verbose_name = "Idempotency (request keys, outbox, inbox)"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - checks register themselves

        # The admin's "Requeue" confirmation is keyed and answers with a redirect
        # (idempotency.admin_actions.keyed_action).
        from .admin import ADMIN_DELIVERY_REQUEUE
        from .admin_actions import ADMIN_NEEDS_ATTENTION, register_keyed_actions

        register_keyed_actions(ADMIN_DELIVERY_REQUEUE, ADMIN_NEEDS_ATTENTION)
