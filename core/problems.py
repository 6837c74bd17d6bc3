"""Render every API error as `application/problem+json` (RFC 9457).

One DRF exception handler covers errors raised inside API views; one
middleware covers what happens outside them (unknown URLs, oversized bodies,
unexpected exceptions) for paths under `/api/` and the operations endpoints,
so no client ever sees an HTML error page or a bare 500 for bad input.

A database that cannot answer now (a `lock_timeout` or `statement_timeout`
expired, the connection refused or lost: Django's `OperationalError`) is a
503 `service_unavailable` with `Retry-After`, not a 500: the request did not
stand (its transaction rolled back) and the same request again, with the same
Idempotency-Key, resumes where it stopped (docs/failure-model.md, "Dependency
faults").
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.db import OperationalError as DatabaseUnavailable
from django.http import Http404, HttpResponse
from django.urls import is_valid_path
from rest_framework import exceptions as drf
from rest_framework.response import Response

from .errors import ApplicationError

logger = logging.getLogger(__name__)

PROBLEM_CONTENT_TYPE = "application/problem+json"

TITLES = {
    400: "Bad request",
    401: "Not authenticated",
    403: "Permission denied",
    404: "Not found",
    405: "Method not allowed",
    406: "Not acceptable",
    409: "Conflict",
    413: "Payload too large",
    415: "Unsupported media type",
    422: "Unprocessable content",
    429: "Throttled",
    500: "Internal server error",
    503: "Service unavailable",
}


def problem_body(
    *, status: int, code: str, detail: str, title: str | None = None, errors: Any = None, **extra
) -> dict[str, Any]:
    """Build the problem document for one error."""
    body: dict[str, Any] = {
        "type": settings.PROBLEM_TYPE_BASE + code.replace("_", "-"),
        "title": title or TITLES.get(status) or code.replace("_", " ").capitalize(),
        "status": status,
        "code": code,
        "detail": detail,
    }
    if errors is not None:
        body["errors"] = errors
    body.update(extra)
    return body


def problem_response(
    *, status: int, code: str, detail: str, headers: dict[str, str] | None = None, **kwargs
) -> HttpResponse:
    """Return a plain Django problem response (outside DRF views)."""
    response = HttpResponse(
        json.dumps(problem_body(status=status, code=code, detail=detail, **kwargs)),
        status=status,
        content_type=PROBLEM_CONTENT_TYPE,
    )
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def _field_errors(value: Any) -> Any:
    """Give a member whose own value is wrong its messages as a list, as `{field: [messages]}`.

    DRF reports an error of a nested object or list as a whole (wrong type,
    empty list, too many items) as `{"non_field_errors": [...]}` one level
    down; the problem document says it on the member itself.
    """
    if isinstance(value, dict):
        if set(value) == {"non_field_errors"}:
            return value["non_field_errors"]
        return {key: _field_errors(item) for key, item in value.items()}
    return value


def _validation_errors(detail: Any) -> dict[str, Any]:
    if isinstance(detail, dict):
        return {key: _field_errors(value) for key, value in detail.items()}
    if isinstance(detail, list):
        return {"non_field_errors": detail}
    return {"non_field_errors": [str(detail)]}


def _first_message(errors: Any) -> str:
    """Find one human sentence in a nested DRF error structure."""
    if isinstance(errors, dict):
        for field, value in errors.items():
            message = _first_message(value)
            if message:
                return message if field == "non_field_errors" else f"{field}: {message}"
    elif isinstance(errors, list):
        for value in errors:
            message = _first_message(value)
            if message:
                return message
    elif errors:
        return str(errors)
    return ""


def exception_to_problem(exc: Exception) -> tuple[dict[str, Any], int, dict[str, str]] | None:
    """Map an exception to (body, status, headers), or None if it is not a client error."""
    headers: dict[str, str] = {}
    if isinstance(exc, ApplicationError):
        body = problem_body(
            status=exc.status,
            code=exc.code,
            detail=exc.detail,
            title=exc.title,
            errors=exc.errors,
            **exc.extra,
        )
        return body, exc.status, dict(exc.headers)
    if isinstance(exc, DatabaseUnavailable):
        return _database_unavailable(exc)
    if isinstance(exc, Http404):
        exc = drf.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = drf.PermissionDenied()
    elif isinstance(exc, RequestDataTooBig):
        return (
            problem_body(
                status=413, code="payload_too_large", detail="The request body is too large."
            ),
            413,
            headers,
        )
    if not isinstance(exc, drf.APIException):
        return None

    status = exc.status_code
    if isinstance(exc, drf.ValidationError):
        errors = _validation_errors(exc.detail)
        detail = _first_message(errors) or "The request is invalid."
        return (
            problem_body(status=400, code="invalid_request", detail=detail, errors=errors),
            400,
            headers,
        )
    if isinstance(exc, drf.ParseError):
        code = "malformed_json"
        detail = str(exc.detail)
    elif isinstance(exc, drf.NotAuthenticated | drf.AuthenticationFailed):
        code = "not_authenticated"
        detail = str(exc.detail)
        auth_header = getattr(exc, "auth_header", None)
        if auth_header:
            headers["WWW-Authenticate"] = auth_header
    elif isinstance(exc, drf.PermissionDenied):
        code, detail = "permission_denied", str(exc.detail)
    elif isinstance(exc, drf.NotFound):
        code, detail = "not_found", "Not found."
    elif isinstance(exc, drf.MethodNotAllowed):
        code, detail = "method_not_allowed", str(exc.detail)
    elif isinstance(exc, drf.UnsupportedMediaType):
        code, detail = "unsupported_media_type", str(exc.detail)
    elif isinstance(exc, drf.NotAcceptable):
        code, detail = "not_acceptable", str(exc.detail)
    elif isinstance(exc, drf.Throttled):
        code, detail = "throttled", str(exc.detail)
        wait = exc.wait  # type: ignore[attr-defined]  # the stubs' Throttled has no .wait
        if wait is not None:
            headers["Retry-After"] = str(max(1, int(wait + 0.999)))
    else:
        code = getattr(exc, "default_code", "error") or "error"
        detail = str(exc.detail)
    return problem_body(status=status, code=code, detail=detail), status, headers


# PostgreSQL's lock_not_available and query_canceled: a bound on waiting ran out (the
# server is busy, not gone); anything else (no SQLSTATE: a refused or lost connection).
_TIMEOUT_SQLSTATES = frozenset({"55P03", "57014"})


def _database_unavailable(exc: Exception) -> tuple[dict[str, Any], int, dict[str, str]]:
    sqlstate = getattr(exc.__cause__, "sqlstate", None)
    busy = sqlstate in _TIMEOUT_SQLSTATES
    logger.warning(
        "database unavailable (%s): answered 503", sqlstate or "no connection", exc_info=exc
    )
    detail = (
        "The database is busy." if busy else "The database cannot be reached."
    ) + " The request did not finish: send it again (with the same Idempotency-Key) to finish it."
    body = problem_body(status=503, code="service_unavailable", detail=detail)
    return body, 503, {"Retry-After": "1" if busy else "2"}


def drf_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Turn any client error raised in a DRF view into a problem response."""
    mapped = exception_to_problem(exc)
    if mapped is None:
        return None
    body, status, headers = mapped
    response = Response(body, status=status, headers=headers, content_type=PROBLEM_CONTENT_TYPE)
    return response


def is_api_path(path: str) -> bool:
    """The API's paths: problem+json answers, in English (core.middleware.LocaleMiddleware)."""
    return path.startswith("/api/") or path.rstrip("/") in ("/healthz", "/metrics")


def _append_slash(request) -> None:
    """Serve an API path written without its trailing slash as the path with it.

    Django's APPEND_SLASH would answer with a 301 (an HTML response) that
    clients follow as a GET, dropping a POST's body. Rewriting in place keeps
    one resource per path; the key fingerprint uses the slashed path, so both
    spellings are the same request.
    """
    path = request.path_info
    if path.endswith("/"):
        return
    urlconf = getattr(request, "urlconf", None)
    if is_valid_path(path, urlconf) or not is_valid_path(path + "/", urlconf):
        return
    request.path_info = path + "/"
    request.path = request.path + "/"


class ProblemMiddleware:
    """Keep HTML error pages and bare 500s out of the API.

    Oversized bodies are refused before any view reads them: DRF streams the
    body to its parser and would otherwise bypass DATA_UPLOAD_MAX_MEMORY_SIZE.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if is_api_path(request.path):
            _append_slash(request)
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            if limit is not None and length > limit:
                return problem_response(
                    status=413,
                    code="payload_too_large",
                    detail=f"The request body is larger than {limit} bytes.",
                )
        response = self.get_response(request)
        if (
            is_api_path(request.path)
            and response.status_code >= 400
            and not response.get("Content-Type", "").startswith(PROBLEM_CONTENT_TYPE)
            and not response.get("Content-Type", "").startswith("text/plain; version=0.0.4")
        ):
            status = response.status_code
            code = {404: "not_found", 405: "method_not_allowed", 403: "permission_denied"}.get(
                status, "internal_error" if status >= 500 else "invalid_request"
            )
            detail = TITLES.get(status, "Error") + "."
            return problem_response(status=status, code=code, detail=detail)
        return response

    def process_exception(self, request, exception):
        if not is_api_path(request.path):
            return None
        mapped = exception_to_problem(exception)
        if mapped is not None:
            body, status, headers = mapped
            return problem_response(
                status=status,
                code=body.pop("code"),
                detail=body.pop("detail"),
                headers=headers,
                **{k: v for k, v in body.items() if k not in ("type", "status")},
            )
        logger.exception("Unhandled error on %s", request.path, exc_info=exception)
        return problem_response(
            status=500, code="internal_error", detail="An unexpected error occurred."
        )
