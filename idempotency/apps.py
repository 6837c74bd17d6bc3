from django.apps import AppConfig


class IdempotencyConfig(AppConfig):
    name = "idempotency"
    verbose_name = "Idempotency (request keys, outbox, inbox)"

    def ready(self) -> None:
        # The checks register themselves; the keyed confirmations ("Requeue",
        # "Needs attention") are declared where their names are
        # (idempotency.keys.keyed_operation).
        from . import admin, admin_actions, checks  # noqa: F401
