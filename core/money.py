"""Money as decimal strings in the shop currency's minor units, and in words per locale.

The minor units of a currency are CLDR's, through babel, for any ISO 4217 code;
an unknown code is an error, never a guess (`SHOP_CURRENCY` is checked at start,
`core.checks.shop_currency_is_iso`). The API and the events carry `format_money`'s decimal
strings; pages and e-mails show `display_money` in the active language
("€19.99" in English, "19,99 €" in French; docs/storefront.md).
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import cast

from babel.numbers import format_currency, get_currency_precision, is_currency
from django.conf import settings
from django.utils import translation
from django.utils.translation import gettext as _
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from .errors import ApplicationError

_MONEY_RE = re.compile(r"^-?\d{1,10}(\.\d+)?$")


def shop_currency() -> str:
    return settings.SHOP_CURRENCY


class UnknownCurrency(ValueError):
    """A code that is no ISO 4217 currency babel knows."""


def minor_units(currency: str | None = None) -> int:
    """The currency's decimal places (CLDR's, through babel); raise UnknownCurrency if unknown."""
    code = currency or shop_currency()
    if not is_currency(code):
        raise UnknownCurrency(f"{code!r} is not an ISO 4217 currency code.")
    return get_currency_precision(code)


def format_money(amount: Decimal, currency: str | None = None) -> str:
    """Render an amount with exactly the currency's minor units."""
    places = minor_units(currency)
    return f"{amount:.{places}f}"


def display_money(amount: Decimal, currency: str | None = None) -> str:
    """The amount in words for people, in the active language: "€19.99", "19,99 €"."""
    code = currency or shop_currency()
    minor_units(code)  # an unknown code raises here, not deep in babel
    locale = translation.to_locale(translation.get_language() or settings.LANGUAGE_CODE)
    return format_currency(amount, code, locale=locale)


class CurrencyMismatch(ApplicationError):
    status = 422
    code = "currency_mismatch"
    title = "Currency mismatch"


def check_currency(currency: str) -> None:
    """Refuse any currency but the shop's."""
    if currency != shop_currency():
        raise CurrencyMismatch(
            _("This shop only accepts {shop}; got {currency!r}.").format(
                shop=shop_currency(), currency=currency
            ),
            errors={"currency": [_("Must be {shop}.").format(shop=shop_currency())]},
        )


@extend_schema_field(
    {"type": "string", "format": "decimal", "pattern": r"^\d+(\.\d+)?$", "example": "19.99"}
)
class MoneyField(serializers.Field):
    """A decimal string, never a JSON number, with at most the currency's minor units."""

    default_error_messages = {
        "not_string": 'Money must be a decimal string such as "19.99", not a JSON number.',
        "invalid": "Not a valid amount.",
        "places": "At most {places} decimal places.",
        "negative": "Must not be negative.",
    }

    def __init__(self, *, allow_negative: bool = False, **kwargs):
        self.allow_negative = allow_negative
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("not_string")
        if not _MONEY_RE.match(data):
            self.fail("invalid")
        amount = Decimal(data)
        places = minor_units()
        if -cast(int, amount.as_tuple().exponent) > places:  # finite: matched _MONEY_RE
            self.fail("places", places=places)
        if amount < 0 and not self.allow_negative:
            self.fail("negative")
        return amount

    def to_representation(self, value):
        return format_money(Decimal(value))
