"""`{% load shop %}`: statuses in words and money with its currency."""

from decimal import Decimal

from django import template

from core.money import display_money

from .. import words

register = template.Library()

_TABLES = {
    "order": words.ORDER_STATUS,
    "line": words.LINE_STATUS,
    "payment": words.PAYMENT_STATUS,
    "fulfillment": words.FULFILLMENT,
    "tracking": words.TRACKING_STATUS,
    "return": words.RETURN_STATUS,
    "step": words.STEP_STATUS,
    "step_name": words.STEP_NAME,
    "refund": words.REFUND_STATUS,
    "refund_origin": words.REFUND_ORIGIN,
}


@register.filter
def in_words(value: str, kind: str) -> str:
    """`{{ order.status|in_words:"order" }}` → "Payment declined" (in the active language)."""
    return words.words(_TABLES[kind], str(value))


@register.filter
def money(amount, currency: str | None = None) -> str:
    """`{{ product.price|money }}` → "€19.99" in English, "19,99 €" in French."""
    return display_money(Decimal(amount), currency or None)


@register.simple_tag(takes_context=True)
def cart_count(context) -> int:
    """Units in the shopper's cart, or the guest's session cart (0 without a cart)."""
    from django.db.models import Sum

    from ..cart import GUEST_CART, guest_cart
    from ..models import CartLine

    request = context.get("request")
    if request is None:
        return 0
    if not request.user.is_authenticated:
        if GUEST_CART not in request.session:  # reading it would not create a session
            return 0
        return sum(n for _sku, n in guest_cart(session=request.session).lines)
    total = CartLine.objects.filter(cart__user=request.user).aggregate(n=Sum("quantity"))["n"]
    return total or 0


@register.filter
def country_name(code: str) -> str:
    """`{{ address.country|country_name }}` → "United Kingdom" (the code if unknown)."""
    from django_countries import countries

    return dict(countries).get(str(code).upper(), code)
