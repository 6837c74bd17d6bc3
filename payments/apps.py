from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class PaymentsConfig(AppConfig):
    name = "payments"
    verbose_name = _("Payments")

    def ready(self) -> None:
        # The admin's refund decisions ask first; their keyed confirmations are
        # declared where their names are (idempotency.keys.keyed_operation).
        from . import (
            admin,  # noqa: F401
            checks,  # noqa: F401 - checks register themselves
        )
