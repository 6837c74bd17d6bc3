"""The one exception root of the shop.

Every domain refusal is an `ApplicationError` subclass (or instance) with a
stable snake_case `code` that clients switch on; `core.problems`
renders it as an RFC 9457 problem response.
"""

from __future__ import annotations

from typing import Any


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
