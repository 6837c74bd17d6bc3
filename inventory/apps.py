from django.apps import AppConfig


class InventoryConfig(AppConfig):
    name = "inventory"
    verbose_name = "Catalog and stock"

    def ready(self) -> None:
        from idempotency.operations import register_operation, single_phase_resume

        from . import operations
        from .api import presenters

        # The completer stores what the API would have (its one phase never
        # leaves a half-done key: an unfinished one is forgotten).
        register_operation(
            operations.STOCK_ADJUST, resume=single_phase_resume, present=presenters.stock_adjusted
        )
        # The admin's "Adjust stock" form (inventory/admin_forms.py) answers with redirects.
        from . import admin_forms

        register_operation(
            admin_forms.ADMIN_STOCK_ADJUST,
            resume=single_phase_resume,
            present=admin_forms.stock_redirect,
        )
