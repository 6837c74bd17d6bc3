"""The provider interface the shop codes against, and how its answers are classified."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum


class Outcome(StrEnum):
    """What the shop may conclude from one provider answer."""

    SUCCEEDED = "succeeded"  # the operation happened at the provider
    DECLINED = "declined"  # final: the provider refused; nothing moved; never retried
    UNKNOWN = "unknown"  # timeout, connection error, 5xx, conflict: maybe it happened
    NOT_FOUND = "not_found"  # look-up only: the provider has no operation under this key


@dataclass(frozen=True)
class ProviderResult:
    """One provider answer (or the lack of one), classified."""

    outcome: Outcome
    key: str
    operation: dict | None = None  # the provider's record of the operation, when it sent one
    http_status: int | None = None
    code: str = ""  # provider error code, or the exception's name
    detail: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def amount(self) -> Decimal | None:
        return Decimal(self.operation["amount"]) if self.operation else None

    @property
    def currency(self) -> str | None:
        return self.operation["currency"] if self.operation else None

    @property
    def operation_id(self) -> str:
        return self.operation["id"] if self.operation else ""

    def describe(self) -> str:
        parts = [str(self.outcome)]
        if self.http_status:
            parts.append(str(self.http_status))
        if self.code:
            parts.append(self.code)
        if self.detail:
            parts.append(self.detail)
        return " ".join(parts)[:500]


class PaymentGateway(abc.ABC):
    """A payment provider. Every mutating call carries the caller's provider key.

    Implementations must never raise for a provider or network failure:
    they return an UNKNOWN result instead, because the caller must then keep
    the operation pending, never treat it as failed.
    """

    @abc.abstractmethod
    def authorize(
        self, *, key: str, amount: Decimal, currency: str, payment_method: str, reference: str
    ) -> ProviderResult:
        """Authorize `amount` on the payment method (nothing is captured yet)."""

    @abc.abstractmethod
    def capture(
        self,
        *,
        key: str,
        amount: Decimal,
        currency: str,
        reference: str,
        payment_method: str | None = None,
        authorization_key: str | None = None,
    ) -> ProviderResult:
        """Take `amount`: from an earlier authorization, or directly from a payment method."""

    @abc.abstractmethod
    def void(self, *, key: str, authorization_key: str, reference: str) -> ProviderResult:
        """Void an authorization: the amount it has not captured goes back to the payment method."""

    @abc.abstractmethod
    def refund(
        self, *, key: str, capture_key: str, amount: Decimal, currency: str, reference: str
    ) -> ProviderResult:
        """Give back `amount` of an earlier capture."""

    @abc.abstractmethod
    def lookup(self, *, key: str) -> ProviderResult:
        """Ask what became of the call sent under `key` (SUCCEEDED/DECLINED/NOT_FOUND/UNKNOWN)."""

    @abc.abstractmethod
    def operations(self, *, key_prefix: str) -> Iterator[dict]:
        """Yield the provider's ledger (operations whose key starts with `key_prefix`).

        Raises `ProviderUnreachable` when the ledger cannot be read completely.
        """


class ProviderUnreachable(Exception):
    """The provider's ledger could not be read (reconciliation cannot judge)."""
