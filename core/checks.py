"""System checks: the shop currency must be one whose minor units babel knows."""

from babel.numbers import is_currency
from django.conf import settings
from django.core import checks


@checks.register()
def shop_currency_is_iso(app_configs, **kwargs):
    """Refuse a SHOP_CURRENCY that is no ISO 4217 code (core.money takes its minor units)."""
    currency = getattr(settings, "SHOP_CURRENCY", None)
    if isinstance(currency, str) and is_currency(currency):
        return []
    return [
        checks.Error(
            f"SHOP_CURRENCY={currency!r} is not an ISO 4217 currency code.",
            hint='Set SHOP_CURRENCY to an upper-case ISO 4217 code such as "EUR" or "JPY".',
            id="core.E001",
        )
    ]
