from django.apps import AppConfig


class PaymentsConfig(AppConfig):
    name = "payments"

    def ready(self) -> None:
        # The admin's refund decisions ask first; their keyed confirmations are
        # declared where their names are (idempotency.keys.keyed_operation).
        from . import (
            admin,  # noqa: F401
            checks,  # noqa: F401 - checks register themselves
        )
