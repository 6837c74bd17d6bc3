"""The one exception root of the shop.

Every domain refusal is an `ApplicationError` subclass (or instance) with a
stable snake_case `code` that clients switch on; `core.problems`
renders it as an RFC 9457 problem response.
"""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext_noop

# The refusals' titles as people read them: the admin's and the storefront's
# messages show `gettext(error.default_title())`, the API answers them in
# English. Marked here for the catalogues (docs/storefront.md, "Languages");
# tests/shop/test_catalogue.py fails when a refusal's title has no translation.
TITLES_FOR_PEOPLE = (
    gettext_noop("Invalid request"),
    gettext_noop("Not found"),
    gettext_noop("Conflict"),
    gettext_noop("Unprocessable"),
    gettext_noop("Invalid state"),
    gettext_noop("Idempotency key missing"),
    gettext_noop("Idempotency key invalid"),
    gettext_noop("Idempotency key in use"),
    gettext_noop("Idempotency key reused"),
    gettext_noop("Currency mismatch"),
    gettext_noop("SKU exists"),
    gettext_noop("Stock below reserved"),
    gettext_noop("Stock limit exceeded"),
    gettext_noop("Payment reference conflict"),
    gettext_noop("Invalid payment transition"),
    gettext_noop("Refund exceeds captured"),
    gettext_noop("Refund conflict"),
    gettext_noop("Exceeds unshipped"),
    gettext_noop("Return exceeds order"),
    gettext_noop("Line not shipped"),
    gettext_noop("Throttled"),
    gettext_noop("Insufficient stock"),
    gettext_noop("Price changed"),
    gettext_noop("Reservation expired"),
    gettext_noop("Payment pending"),
    gettext_noop("Order shipped"),
    gettext_noop("Payment declined"),
    gettext_noop("Already ordered"),
    gettext_noop("Cart changed"),
    gettext_noop("Cart full"),
    gettext_noop("Invalid signature"),
    gettext_noop("Malformed JSON"),
    gettext_noop("Day not closed"),
    gettext_noop("Report not aggregated"),
    gettext_noop("Username taken"),
    gettext_noop("Invalid credentials"),
)


class ApplicationError(Exception):
    """Raise to refuse a request with a stable code and an HTTP status."""

    status: int = 400
    code: str = "invalid_request"
    title: str | None = None

    def __init__(
        self,
        detail: str | None = None,
        *,
        code: str | None = None,
        status: int | None = None,
        title: str | None = None,
        errors: Any = None,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        if title is not None:
            self.title = title
        self.detail = detail or self.default_title()
        self.errors = errors
        self.extra = extra or {}
        self.headers = headers or {}
        super().__init__(self.detail)

    def default_title(self) -> str:
        return self.title or self.code.replace("_", " ").capitalize()


class InvalidRequest(ApplicationError):
    status = 400
    code = "invalid_request"


class NotFound(ApplicationError):
    status = 404
    code = "not_found"


class Conflict(ApplicationError):
    status = 409
    code = "conflict"


class Unprocessable(ApplicationError):
    status = 422
    code = "unprocessable"


class InvalidState(ApplicationError):
    """Refuse what the thing's current state does not allow (an order, a payment, a return)."""

    status = 409
    code = "invalid_state"
    title = "Invalid state"
