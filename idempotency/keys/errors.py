"""Refusals of a request key (problem responses) and the lost-lease and lost-claim exceptions."""

from __future__ import annotations

from core.errors import ApplicationError


class IdempotencyKeyMissing(ApplicationError):
    status = 400
    code = "idempotency_key_missing"
    title = "Idempotency key missing"


class IdempotencyKeyInvalid(ApplicationError):
    status = 400
    code = "idempotency_key_invalid"
    title = "Idempotency key invalid"


class IdempotencyKeyInUse(ApplicationError):
    status = 409
    code = "idempotency_key_in_use"
    title = "Idempotency key in use"


class IdempotencyKeyReused(ApplicationError):
    status = 422
    code = "idempotency_key_reused"
    title = "Idempotency key reused"


class KeyLeaseLost(Exception):
    """Raised when a run's fencing token no longer holds its key: another run took it over."""


class KeyClaimLost(KeyLeaseLost):
    """Raised when a fresh run's insert finds the key taken by another request."""
