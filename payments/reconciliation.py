"""Reconciliation: the provider's ledger against the shop's books, per provider key.

The provider side comes only from the provider (its ledger over HTTP); the
shop side only from the shop's tables. Every money movement must appear on
both sides with the same kind, amount and currency, and every payment's
captured and refunded totals must equal what the provider moved for it
(refunds staff recorded as made outside the shop excepted). Every refund at
the provider matches one refund row with the same amount, and the other way
round.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from decimal import Decimal

from .gateway import PaymentGateway, get_gateway
from .models import Payment, Refund, RefundStatus, TransactionStatus
from .selectors import install_id_or_none, transactions_with_key_prefix

MISSING_AT_PROVIDER = "missing_at_provider"  # the shop booked money the provider never moved
EXTRA_AT_PROVIDER = "extra_at_provider"  # the provider moved money the shop has not booked
UNRECORDED = "unrecorded"  # the provider moved money; the shop's call is still pending
DIFFERENT_AMOUNT = "different_amount"  # both moved money, not the same amount/currency/kind
DIFFERENT_TOTAL = "different_total"  # a payment's captured/refunded total differs
REFUND_UNMATCHED = "refund_unmatched"  # a provider refund with no refund row, or the other way
REFUND_DIFFERENT = "refund_different"  # a refund row and its provider refund disagree
# The provider refunded a refund staff recorded as outside the shop / failed
# (a needs-attention item until staff "Accept the provider's refund").
REFUND_AFTER_DECISION = "refund_after_decision"


@dataclass(frozen=True)
class Difference:
    kind: str
    key: str
    detail: str


@dataclass
class ReconciliationReport:
    install_id: str | None
    provider_operations: int = 0
    shop_transactions: int = 0
    differences: list[Difference] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.differences

    def as_dict(self) -> dict:
        return {
            "install_id": self.install_id,
            "provider_operations": self.provider_operations,
            "shop_transactions": self.shop_transactions,
            "differences": [asdict(d) for d in self.differences],
            "clean": self.clean,
        }


# "pending" is the stored word before payments/0004: a process of the previous release
# may still write it while the release migrates; settlement overwrites it when it closes
# the call.
_UNKNOWN_STATUSES = (TransactionStatus.UNKNOWN, "pending")


def _money(amount, currency) -> str:
    return f"{amount} {currency}"


def reconcile_payments(*, gateway: PaymentGateway | None = None) -> ReconciliationReport:
    """Compare the provider's ledger with the shop's transactions and payment totals.

    Raises `ProviderUnreachable` when the ledger cannot be read.
    """
    install = install_id_or_none()
    report = ReconciliationReport(install_id=install)
    if install is None:
        return report  # this installation never called the provider
    prefix = f"{install}:"
    ops = {op["key"]: op for op in (gateway or get_gateway()).operations(key_prefix=prefix)}
    txns = {t.provider_key: t for t in transactions_with_key_prefix(key_prefix=prefix)}
    report.provider_operations = len(ops)
    report.shop_transactions = len(txns)
    diffs = report.differences

    for key in sorted(set(ops) | set(txns)):
        op, txn = ops.get(key), txns.get(key)
        provider_moved = op is not None and op["status"] == "succeeded"
        shop_moved = txn is not None and txn.status == TransactionStatus.SUCCEEDED
        if shop_moved and not provider_moved:
            assert txn is not None  # shop_moved
            state = op["status"] if op else "no operation"
            diffs.append(
                Difference(
                    MISSING_AT_PROVIDER,
                    key,
                    f"shop booked {txn.kind} {_money(txn.amount, txn.currency)}; provider: {state}",
                )
            )
        elif provider_moved and not shop_moved:
            assert op is not None  # provider_moved
            money = f"provider {op['kind']} {_money(op['amount'], op['currency'])}"
            if txn is not None and txn.status in _UNKNOWN_STATUSES:
                diffs.append(Difference(UNRECORDED, key, f"{money}; shop outcome unknown"))
            else:
                state = f"shop {txn.status}" if txn else "shop has no transaction"
                diffs.append(Difference(EXTRA_AT_PROVIDER, key, f"{money}; {state}"))
        elif provider_moved and shop_moved:
            assert op is not None and txn is not None
            theirs = (op["kind"], Decimal(op["amount"]), op["currency"])
            ours = (txn.kind, txn.amount, txn.currency)
            if theirs != ours:
                diffs.append(
                    Difference(
                        DIFFERENT_AMOUNT,
                        key,
                        f"provider {theirs[0]} {_money(theirs[1], theirs[2])}, "
                        f"shop {ours[0]} {_money(ours[1], ours[2])}",
                    )
                )

    # Refunds: every refund at the provider is one refund row with the same
    # amount and currency, and every refund the shop booked as given back by
    # the provider is a succeeded refund there. Refunds staff recorded as
    # made outside the shop have no provider refund (and must not have one).
    refunds = {
        r.provider_key: r
        for r in Refund.objects.filter(provider_key__startswith=prefix).select_related("payment")
    }
    outside: dict[str, Decimal] = defaultdict(Decimal)
    for key in sorted(set(refunds) | {k for k, op in ops.items() if op["kind"] == "refund"}):
        op, refund = ops.get(key), refunds.get(key)
        provider_moved = op is not None and op["status"] == "succeeded"
        if refund is None:
            if op is not None and provider_moved:
                diffs.append(
                    Difference(
                        REFUND_UNMATCHED,
                        key,
                        f"provider refunded {_money(op['amount'], op['currency'])}; no refund row",
                    )
                )
            continue
        decided = refund.outside_shop or refund.status == RefundStatus.FAILED
        if decided and op is not None and provider_moved:
            recorded = "outside the shop" if refund.outside_shop else "failed"
            diffs.append(
                Difference(
                    REFUND_AFTER_DECISION,
                    key,
                    f"the provider reports a refund that was recorded as {recorded} "
                    f"({_money(op['amount'], op['currency'])})"
                    + ("; needs attention" if refund.needs_attention else ""),
                )
            )
        if refund.outside_shop:
            outside[refund.payment.reference] += refund.amount
            continue
        if decided and op is not None and provider_moved:
            continue
        booked = refund.status == RefundStatus.SUCCEEDED
        if booked and not provider_moved:
            diffs.append(
                Difference(
                    REFUND_UNMATCHED,
                    key,
                    f"shop booked refund {_money(refund.amount, refund.currency)}; provider: "
                    f"{op['status'] if op else 'no operation'}",
                )
            )
        elif (
            op is not None
            and provider_moved
            and (Decimal(op["amount"]), op["currency"]) != (refund.amount, refund.currency)
        ):
            diffs.append(
                Difference(
                    REFUND_DIFFERENT,
                    key,
                    f"provider refunded {_money(op['amount'], op['currency'])}, "
                    f"refund row {_money(refund.amount, refund.currency)}",
                )
            )
        elif op is not None and provider_moved and not booked:
            diffs.append(
                Difference(
                    UNRECORDED if refund.status == RefundStatus.PENDING else REFUND_DIFFERENT,
                    key,
                    f"provider refunded {_money(op['amount'], op['currency'])}; "
                    f"refund row {refund.status}",
                )
            )

    # Per payment: what the provider moved (grouped by the provider's own
    # references and parent keys) against the payment's booked totals.
    captured: dict[str, Decimal] = defaultdict(Decimal)
    refunded: dict[str, Decimal] = defaultdict(Decimal)
    capture_reference: dict[str, str] = {}
    for op in ops.values():
        if op["kind"] == "capture" and op["status"] == "succeeded":
            captured[op["reference"]] += Decimal(op["amount"])
            capture_reference[op["key"]] = op["reference"]
    for op in ops.values():
        if op["kind"] == "refund" and op["status"] == "succeeded":
            refunded[capture_reference.get(op["parent_key"], "?")] += Decimal(op["amount"])
    references = {t.payment.reference for t in txns.values()} | set(captured) | set(refunded)
    payments = {p.reference: p for p in Payment.objects.filter(reference__in=references)}
    for reference in sorted(references):
        payment = payments.get(reference)
        shop_totals = (
            (payment.amount_captured, payment.amount_refunded - outside.get(reference, 0))
            if payment
            else (Decimal(0),) * 2
        )
        moved = (captured.get(reference, Decimal(0)), refunded.get(reference, Decimal(0)))
        if shop_totals != moved:
            diffs.append(
                Difference(
                    DIFFERENT_TOTAL,
                    reference,
                    f"provider captured {moved[0]} refunded {moved[1]}; "
                    f"shop captured {shop_totals[0]} refunded {shop_totals[1]}",
                )
            )
    return report
