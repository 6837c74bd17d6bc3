"""Template tags: `{% load idempotency %}` then `{% idempotency_key_field %}` inside a form."""

from django import template

from ..views import FORM_FIELD, form_key_field

register = template.Library()


@register.simple_tag
def idempotency_key_field(field: str = FORM_FIELD) -> str:
    """Render the hidden input with a fresh idempotency key for this form."""
    return form_key_field(field)
