from django.apps import AppConfig


class InventoryConfig(AppConfig):
    name = "inventory"
    verbose_name = "Catalog and stock"

    def ready(self) -> None:
        # The keyed operations are declared on their callers' presenters
        # (idempotency.keys.keyed_operation): the API's and the admin form's.
        from . import admin_forms  # noqa: F401
        from .api import presenters  # noqa: F401
