"""Validate a key's header value and fingerprint the request body it keys."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from .errors import IdempotencyKeyInvalid, IdempotencyKeyMissing

MAX_KEY_LENGTH = 255


def key_validate(value: str | None) -> str:
    """Return the key from an `Idempotency-Key` value, or refuse it with a 400 problem.

    A value wrapped in double quotes (the IETF draft's structured-field string)
    is accepted without its quotes.
    """
    if value is None:
        raise IdempotencyKeyMissing("This endpoint needs an Idempotency-Key header.")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    if (
        not value
        or len(value) > MAX_KEY_LENGTH
        or not value.isascii()
        or not value.isprintable()
        or " " in value
    ):
        raise IdempotencyKeyInvalid(
            f"An idempotency key is 1 to {MAX_KEY_LENGTH} visible ASCII characters."
        )
    return value


def canonical_json(data: Any) -> bytes:
    """Render `data` as canonical JSON: sorted keys, no insignificant whitespace, UTF-8."""
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def body_fingerprint(data: Any) -> str:
    """Return the SHA-256 (hex) of the parsed body's canonical JSON.

    An empty body counts as the empty object `{}` (both carry no parameters).
    A form body (a QueryDict) counts as {field: [values...]}.
    """
    if data is None:
        data = {}
    elif isinstance(data, Mapping) and hasattr(data, "getlist"):
        data = {name: data.getlist(name) for name in data}
    return hashlib.sha256(canonical_json(data)).hexdigest()
