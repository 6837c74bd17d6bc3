"""The payments app's errors, and the guard that no provider call runs inside a transaction.

Every refusal a payments service raises is named here once, so the capture,
settlement, refund and recording modules (and their callers) share one class
per refusal.
"""

from __future__ import annotations

from django.db import connection

from core.errors import ApplicationError, InvalidState


class PaymentReferenceConflict(ApplicationError):
    status = 409
    code = "payment_reference_conflict"
    title = "Payment reference conflict"


class InvalidPaymentTransition(ApplicationError):
    status = 409
    code = "invalid_payment_transition"
    title = "Invalid payment transition"


class TransactionOpen(RuntimeError):
    """A provider call was attempted inside a database transaction."""


def require_no_transaction(what: str) -> None:
    """Refuse a provider call inside a transaction (TransactionOpen): no lock held across it."""
    if connection.in_atomic_block:
        raise TransactionOpen(f"{what} calls the provider: call it with no transaction open")


class RefundExceedsCaptured(ApplicationError):
    status = 422
    code = "refund_exceeds_captured"
    title = "Refund exceeds captured"


class RefundInvalidState(InvalidState):
    """The one `invalid_state` refusal (its answer is `InvalidState`'s), kept as its own
    name so the refund path can catch its own refusals and not any other's."""


class RefundConflict(ApplicationError):
    status = 409
    code = "refund_conflict"
    title = "Refund conflict"


class RefundBudgetMoved(Exception):
    """The budget changed under every try of `refund_request_capped`: transient, try later."""
