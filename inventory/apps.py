from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class InventoryConfig(AppConfig):
    name = "inventory"
    verbose_name = _("Catalog and stock")

    def ready(self) -> None:
        # The keyed operations are declared on their callers' presenters
        # (idempotency.keys.keyed_operation): the API's and the admin form's.
        from . import admin_forms  # noqa: F401
        from .api import presenters  # noqa: F401
