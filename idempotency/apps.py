from django.apps import AppConfig


class IdempotencyConfig(AppConfig):
    name = "idempotency"
    verbose_name = "Idempotency (request keys, outbox, inbox)"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - checks register themselves
