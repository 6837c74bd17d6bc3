from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class IdempotencyConfig(AppConfig):
    name = "idempotency"
    verbose_name = _("Idempotency (request keys, outbox, inbox)")

    def ready(self) -> None:
        # The checks register themselves; the keyed confirmations ("Requeue",
        # "Needs attention") are declared where their names are
        # (idempotency.keys.keyed_operation).
        from . import admin, admin_actions, checks  # noqa: F401
