"""Structured logs: one JSON object per line, with the request's context and no secrets.

Every line carries `time`, `level`, `logger`, `message` and, where known,
`request_id` (the `X-Request-ID` of the request, see core.middleware),
`user_id`, `idempotency_key_hash` (never the key), `order_id`, `task` /
`task_id` (Celery), `host` (SHOP_HOST_NAME, set by the run command: which
host of several wrote the line), plus whatever the call passed as `extra={...}`.

The context is a contextvar bound by the request middleware, the keyed-view
glue and the Celery signals (`log_context(...)`); any code may add to it
(`bind(order_id=...)`). Fields whose name says secret (token, password,
authorization, cookie, card, secret) are replaced by "[redacted]"; a field
named `key` or `idempotency_key` is replaced by its hash; card-number-like
digit runs and `Token <hex>` credentials are masked inside messages too.

`LOG_FORMAT=text` (settings) renders the same fields as `key=value` text.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import hashlib
import json
import logging
import os
import re
import traceback
from collections.abc import Iterator, Mapping
from typing import Any

from django.utils.functional import empty

_context: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "shop_log_context", default=None
)

# Context fields in the order they are written, before the record's extras.
CONTEXT_FIELDS = (
    "request_id",
    "user_id",
    "idempotency_key_hash",
    "order_id",
    "method",
    "route",
    "task",
    "task_id",
)
REDACTED = "[redacted]"
# Which host of several (docs/deployment.md) wrote the line; the run command sets it.
HOST_NAME = os.environ.get("SHOP_HOST_NAME") or None
_SECRET_NAME = re.compile(r"token|password|passwd|secret|authorization|cookie|card|cvc", re.I)
_KEY_NAMES = frozenset({"key", "idempotency_key"})
# A DRF token in an Authorization-like text, and 13-19 digit runs (card numbers,
# with or without spaces/dashes between groups).
_TOKEN_TEXT = re.compile(r"(?i)\b(token|bearer)\s+[0-9a-z._-]{16,}")
_CARD_TEXT = re.compile(r"\b(?:\d[ -]?){12,18}\d\b")

# Attributes every LogRecord has; anything else on a record came from `extra`.
_RECORD_ATTRS = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "", None, None)).keys()
) | {"message", "asctime", "taskName"}


def key_hash(key: str) -> str:
    """Return the short, stable hash of an idempotency key that logs carry instead of the key."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def current() -> dict[str, Any]:
    """Return a copy of the bound log context."""
    return dict(_context.get() or {})


def bind(**fields: Any) -> contextvars.Token:
    """Add fields to the log context (None values are dropped); return the token to reset."""
    merged = {**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}}
    return _context.set(merged)


def reset(token: contextvars.Token) -> None:
    _context.reset(token)


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Bind fields for the duration of the block."""
    token = bind(**fields)
    try:
        yield
    finally:
        _context.reset(token)


def scrub_text(text: str) -> str:
    """Mask credentials and card-number-like digit runs inside free text."""
    text = _TOKEN_TEXT.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    return _CARD_TEXT.sub(REDACTED, text)


def _clean(name: str, value: Any) -> tuple[str, Any]:
    if name in _KEY_NAMES and isinstance(value, str):
        return "idempotency_key_hash", key_hash(value)
    if _SECRET_NAME.search(name):
        return name, REDACTED
    if isinstance(value, str):
        return name, scrub_text(value)
    if isinstance(value, Mapping):
        return name, dict(_clean(str(k), v) for k, v in value.items())
    return name, value


def _user_id(request: Any) -> Any:
    """The authenticated user's id, without making a query from inside a log call.

    DRF sets `request.user` on the Django request once it authenticated; the
    session middleware's lazy user is used only if something already loaded it.
    """
    user = getattr(request, "__dict__", {}).get("user")
    if user is None:
        return None
    wrapped = getattr(user, "_wrapped", user)
    if wrapped is None or wrapped is empty:  # a SimpleLazyObject nobody has loaded
        return None
    if not getattr(wrapped, "is_authenticated", False):
        return None
    return getattr(wrapped, "pk", None)


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """Collect the fields of one log line: base, context, extras (secrets cleaned)."""
    fields: dict[str, Any] = {
        "time": datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC).isoformat(
            timespec="milliseconds"
        ),
        "level": record.levelname,
        "logger": record.name,
        "message": scrub_text(record.getMessage()),
    }
    if HOST_NAME:
        fields["host"] = HOST_NAME
    context = dict(_context.get() or {})
    request = context.pop("request", None)
    if request is not None and "user_id" not in context:
        user_id = _user_id(request)
        if user_id is not None:
            context["user_id"] = user_id
    for name in CONTEXT_FIELDS:
        if name in context:
            fields[name] = context.pop(name)
    for name, value in context.items():
        fields.setdefault(*_clean(name, value))
    for name, value in record.__dict__.items():
        if name in _RECORD_ATTRS or name.startswith("_"):
            continue
        clean_name, clean_value = _clean(name, value)
        fields[clean_name] = clean_value
    if record.exc_info:
        fields["exception"] = scrub_text("".join(traceback.format_exception(*record.exc_info)))
    elif record.exc_text:
        fields["exception"] = scrub_text(record.exc_text)
    if record.stack_info:
        fields["stack"] = record.stack_info
    return fields


class JsonFormatter(logging.Formatter):
    """One JSON object per line (see the module docstring for the fields)."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(record_fields(record), default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """The same fields for humans: `time level logger message key=value ...`."""

    def format(self, record: logging.LogRecord) -> str:
        fields = record_fields(record)
        head = " ".join(str(fields.pop(k)) for k in ("time", "level", "logger", "message"))
        exception = fields.pop("exception", None)
        tail = " ".join(f"{k}={json.dumps(v, default=str)}" for k, v in fields.items())
        line = f"{head} {tail}" if tail else head
        return f"{line}\n{exception}" if exception else line
