from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ShopConfig(AppConfig):
    name = "shop"
    verbose_name = _("Storefront and accounts")

    def ready(self) -> None:
        from idempotency.messaging.relay import register_consumer

        from .events import HANDLED_TYPES

        # Each consumer subscribes to the types it handles: the relay writes no
        # delivery for another type (acknowledged and ignored at the relay).
        register_consumer("loyalty", task="shop.consume_loyalty", event_types=HANDLED_TYPES)
        register_consumer(
            "purchase_history", task="shop.consume_history", event_types=HANDLED_TYPES
        )
        from django.conf import settings

        from .emails import EVENT_TYPES as EMAIL_TYPES

        # Off in the test settings until the relay/consumer tests count a third consumer.
        if settings.SHOP_EMAILS:
            # Batched like loyalty and history: it writes mail rows; shop.send_mail sends them.
            register_consumer(
                "emails",
                task="shop.consume_emails",
                event_types=EMAIL_TYPES,
                batch=settings.SHOP_EMAILS_BATCH,
            )

        # The storefront forms declare their keyed operations on their presenters.
        from . import checkout, returns  # noqa: F401
