from django.apps import AppConfig


class InventoryConfig(AppConfig):
    name = "inventory"
    verbose_name = "Catalog and stock"

    def ready(self) -> None:
        from idempotency.keys import register_operation

        from . import services

        register_operation(services.STOCK_ADJUST, resume=services.stock_adjust_resume)
