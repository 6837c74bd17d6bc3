from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "shop"
    verbose_name = "Storefront and accounts"

    def ready(self) -> None:
        # The storefront forms' operation names, for the completer (shop/checkout.py).
        from .checkout import register_operations

        register_operations()
