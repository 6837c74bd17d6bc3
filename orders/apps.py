from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class OrdersConfig(AppConfig):
    name = "orders"
    verbose_name = _("Orders")

    def ready(self) -> None:
        # The keyed operations are declared on their callers' presenters
        # (idempotency.keys.keyed_operation): the API's, and the admin forms'
        # and confirmations' redirects. Importing them declares them for the completer.
        from .admin import compensation, forms, order  # noqa: F401
        from .api import presenters  # noqa: F401
