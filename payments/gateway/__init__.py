"""The payment provider behind one interface (`PaymentGateway`)."""

from __future__ import annotations

from django.conf import settings
from django.utils.module_loading import import_string

from .base import Outcome, PaymentGateway, ProviderResult, ProviderUnreachable

__all__ = ["Outcome", "PaymentGateway", "ProviderResult", "ProviderUnreachable", "get_gateway"]


def get_gateway() -> PaymentGateway:
    """Return the configured gateway (`settings.PAYMENTS_GATEWAY`, a dotted class path)."""
    return import_string(settings.PAYMENTS_GATEWAY)()
