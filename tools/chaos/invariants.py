"""The chaos run's invariants: what must hold once the system is quiet (docs/failure-model.md).

Each `check_*` function reads the state directly (SQL on the shop's tables,
the provider's SQLite ledger, the broker, the driver's answers.jsonl) and
returns an `Invariant`: its name, how many things it checked, and one line
per violation. Where the shop has a reading of its own (reconciliation) it is
used as one invariant among others, never as the only witness: the counts
that matter (charges per key, stock, points, history) are computed here again.

`pending_work` lists what the system would still do by itself (the `wait`
subcommand polls it); `snapshot` records the state before the workload.

Dev tooling: never imported by production code.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.db import connection

from core.due import DueWork

# Transient answers: no stored decision behind them (see "Chaos run: invariants").
TRANSIENT_CODES = frozenset({"idempotency_key_in_use", "idempotency_key_reused", "throttled"})
ORDER_CREATING_OPERATIONS = ("order.create", "shop.order.create")
CONFIRMED_STATUSES = ("confirmed", "partially_confirmed")
HANDLED_TYPES = (
    "order.confirmed",
    "order.partially_confirmed",
    "order.cancelled",
    "return.completed",
)
CONSUMERS = ("loyalty", "purchase_history")
# Checked apart (`_check_mails_once`): its deliveries exist only where SHOP_EMAILS is on.
EMAILS_CONSUMER = "emails"
WEBHOOK_CONSUMER = "payments.provider"
MAX_SHOWN = 5
# kombu's Redis transport keeps delivered, unacknowledged messages in this hash.
UNACKED_KEY = "unacked"
# Seconds between the two reads of the broker: left over means there both times.
BROKER_REREAD = 2.0


@dataclass
class Invariant:
    """One invariant's result: what it says, how many items it checked, what broke it."""

    name: str
    checked: int = 0
    violations: list[str] = field(default_factory=list)

    def fail(self, message: str) -> None:
        self.violations.append(message)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "checked": self.checked, "violations": self.violations}


@dataclass(frozen=True)
class RunFiles:
    """The run folder's files the checker reads or writes."""

    run_dir: Path

    @property
    def answers(self) -> Path:
        return self.run_dir / "answers.jsonl"

    @property
    def initial(self) -> Path:
        return self.run_dir / "initial.json"

    @property
    def provider(self) -> Path:
        return self.run_dir / "provider.sqlite3"

    @property
    def result(self) -> Path:
        return self.run_dir / "invariants.json"


# -- small readers ---------------------------------------------------------------------


def rows(sql: str, params: Iterable[Any] = ()) -> list[tuple]:
    """Run one read on the shop's database; return its rows."""
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))
        return list(cursor.fetchall())


def scalar(sql: str, params: Iterable[Any] = ()) -> Any:
    found = rows(sql, params)
    return found[0][0] if found else None


def read_answers(path: Path) -> list[dict]:
    """Read answers.jsonl (one object per HTTP attempt); a torn last line is skipped."""
    if not path.exists():
        return []
    answers = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            answers.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the driver was killed mid-write: that attempt has no answer
    return answers


def install_id() -> str | None:
    return scalar("SELECT install_id FROM payments_paymentinstallation WHERE id = 1")


class LedgerFile:
    """The provider's SQLite ledger, read-only (the simulator may be running or dead)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def exists(self) -> bool:
        return self.path.exists()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=30)
        conn.row_factory = sqlite3.Row
        return conn

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        conn = self._connect()
        try:
            return list(conn.execute(sql, tuple(params)))
        finally:
            conn.close()

    def operations(self, *, key_prefix: str) -> Iterator[dict]:
        """Yield operations whose key starts with `key_prefix` (the gateway's `operations`)."""
        for row in self.query(
            "SELECT * FROM operations WHERE substr(key, 1, ?) = ? ORDER BY seq",
            (len(key_prefix), key_prefix),
        ):
            yield dict(row)


# -- snapshot ----------------------------------------------------------------------------


def _committed_by_sku() -> dict[str, int]:
    """Units sold: committed reservation flags, per sku."""
    return {
        sku: int(units)
        for sku, units in rows(
            "SELECT p.sku, COALESCE(SUM(r.quantity), 0) FROM inventory_reservation r "
            "JOIN inventory_stockitem s ON s.id = r.stock_id "
            "JOIN inventory_product p ON p.id = s.product_id "
            "WHERE r.state = 'committed' GROUP BY p.sku"
        )
    }


def _restocked_by_sku() -> dict[str, int]:
    """Units back on hand: received returns and cancelled paid orders whose restock step is done."""
    returned = rows(
        "SELECT ol.sku, SUM(rl.quantity) FROM orders_returnline rl "
        "JOIN orders_orderline ol ON ol.id = rl.order_line_id "
        "JOIN orders_compensationstep st ON st.order_return_id = rl.order_return_id "
        "  AND st.kind = 'return' AND st.name = 'restock' AND st.done_at IS NOT NULL "
        "GROUP BY ol.sku"
    )
    # A cancelled paid order's committed lines come back whole (nothing shipped).
    cancelled = rows(
        "SELECT ol.sku, SUM(ol.quantity_confirmed) FROM orders_orderline ol "
        "JOIN inventory_reservation r ON r.id = ol.reservation_id AND r.state = 'committed' "
        "JOIN orders_compensationstep st ON st.order_id = ol.order_id "
        "  AND st.kind = 'cancellation' AND st.name = 'restock' AND st.done_at IS NOT NULL "
        "GROUP BY ol.sku"
    )
    total: dict[str, int] = defaultdict(int)
    for sku, units in [*returned, *cancelled]:
        total[sku] += int(units or 0)
    return dict(total)


def _stock_by_sku() -> dict[str, tuple[int, int]]:
    return {
        sku: (int(on_hand), int(reserved))
        for sku, on_hand, reserved in rows(
            "SELECT p.sku, s.on_hand, s.reserved FROM inventory_stockitem s "
            "JOIN inventory_product p ON p.id = s.product_id"
        )
    }


def _loyalty_balances() -> dict[str, int]:
    return {
        str(user_id): int(balance)
        for user_id, balance in rows("SELECT user_id, balance FROM shop_loyaltyaccount")
    }


def snapshot() -> dict[str, Any]:
    """Return what `verify` needs of the state before the workload."""
    committed, restocked = _committed_by_sku(), _restocked_by_sku()
    stock = {
        sku: {
            "on_hand": on_hand,
            "reserved": reserved,
            "committed": committed.get(sku, 0),
            "restocked": restocked.get(sku, 0),
        }
        for sku, (on_hand, reserved) in _stock_by_sku().items()
    }
    return {
        "taken_at": str(scalar("SELECT now()")),
        "max_order_number": int(scalar("SELECT COALESCE(MAX(number), 0) FROM orders_order")),
        "stock": stock,
        "loyalty": {
            user: {"balance": balance, "expected": expected_loyalty().get(user, 0)}
            for user, balance in _loyalty_balances().items()
        },
    }


# -- orders and answers ------------------------------------------------------------------


def _is_final(answer: dict) -> bool:
    """An answer that states the key's stored decision (see the doc's definition of "final")."""
    status = answer.get("status")
    if not isinstance(status, int) or status >= 500 or status in (400, 401, 403, 405, 415, 429):
        return False
    body = answer.get("body")
    if isinstance(body, dict):
        if body.get("code") in TRANSIENT_CODES:
            return False
        # A 202 payment_pending leaves the key open: the next retry may answer differently.
        if status == 202 and body.get("status") == "payment_pending":
            return False
    return True


def _users_by_name(names: Iterable[str | None]) -> dict[str, int]:
    wanted = sorted({n for n in names if n})
    if not wanted:
        return {}
    from django.contrib.auth import get_user_model

    table = connection.ops.quote_name(get_user_model()._meta.db_table)
    return dict(rows(f"SELECT username, id FROM {table} WHERE username = ANY(%s)", [wanted]))


def check_orders_per_key(*, initial: dict, answers: list[dict]) -> Invariant:
    """One order per (user, key): every order is named by exactly one key; 2xx answers agree."""
    inv = Invariant("orders_per_key")
    since = int(initial.get("max_order_number", 0))
    named: dict[str, list[tuple[int, str]]] = defaultdict(list)
    key_order: dict[tuple[int, str], str] = {}
    for owner_id, key, order_id in rows(
        "SELECT owner_id, key, data->>'order_id' FROM idempotency_idempotencykey "
        "WHERE operation = ANY(%s) AND data ? 'order_id'",
        [list(ORDER_CREATING_OPERATIONS)],
    ):
        named[order_id].append((owner_id, key))
        key_order[(owner_id, key)] = order_id
    orders = rows(
        "SELECT id::text, number, owner_id FROM orders_order WHERE number > %s ORDER BY number",
        [since],
    )
    owner_of = {order_id: owner for order_id, _, owner in orders}
    for order_id, number, owner_id in orders:
        inv.checked += 1
        keys = named.get(order_id, [])
        if len(keys) != 1:
            inv.fail(f"order {number} ({order_id}) is named by {len(keys)} request keys: {keys}")
        elif keys[0][0] != owner_id:
            inv.fail(f"order {number} is owned by user {owner_id}, its key by user {keys[0][0]}")

    users = _users_by_name(a.get("actor") for a in answers)
    seen: dict[tuple[str, str], set[str]] = defaultdict(set)
    for answer in answers:
        if answer.get("kind") != "checkout" or not answer.get("key"):
            continue
        status, body = answer.get("status"), answer.get("body")
        if not isinstance(status, int) or not 200 <= status < 300 or not isinstance(body, dict):
            continue
        if body.get("id"):
            seen[(answer.get("actor") or "", answer["key"])].add(str(body["id"]))
    for (actor, key), order_ids in sorted(seen.items()):
        inv.checked += 1
        if len(order_ids) != 1:
            inv.fail(f"{actor} key {key!r}: 2xx answers name {len(order_ids)} orders {order_ids}")
            continue
        (order_id,) = order_ids
        user_id = users.get(actor)
        if order_id not in owner_of and not scalar(
            "SELECT 1 FROM orders_order WHERE id::text = %s", [order_id]
        ):
            inv.fail(f"{actor} key {key!r}: answered order {order_id}, which does not exist")
        elif user_id is not None and key_order.get((user_id, key), order_id) != order_id:
            inv.fail(
                f"{actor} key {key!r}: answered order {order_id}, the key names "
                f"{key_order[(user_id, key)]}"
            )
        elif user_id is not None and owner_of.get(order_id, user_id) != user_id:
            inv.fail(f"{actor} key {key!r}: order {order_id} belongs to another user")
    return inv


def check_replays(*, answers: list[dict]) -> Invariant:
    """Every final answer to one (actor, key, method, path) is the same status and body.

    Final answers are compared with each other and with the key's stored
    answer when the key is still in the database.
    """
    inv = Invariant("replays_equal_final")
    groups: dict[tuple[str, str, str, str], list[dict]] = defaultdict(list)
    for answer in answers:
        if answer.get("key") and _is_final(answer):
            ident = (
                answer.get("actor") or "",
                answer["key"],
                (answer.get("method") or "").upper(),
                (answer.get("path") or "").split("?")[0],
            )
            groups[ident].append(answer)
    users = _users_by_name(actor for actor, _, _, _ in groups)
    stored: dict[tuple[int, str], tuple[int, Any]] = {}
    for owner_id, key, status, body in rows(
        "SELECT owner_id, key, response_status, response_body FROM idempotency_idempotencykey "
        "WHERE recovery_point = 'finished'"
    ):
        try:
            parsed = json.loads(body) if body else None
        except json.JSONDecodeError:
            parsed = None  # not JSON (a redirect, a page): the driver records null too
        stored[(owner_id, key)] = (status, parsed)
    for (actor, key, method, path), group in sorted(groups.items()):
        inv.checked += 1
        group.sort(key=lambda a: a.get("t") or 0)
        reference = (group[0]["status"], group[0].get("body"))
        for answer in group[1:]:
            if (answer["status"], answer.get("body")) != reference:
                inv.fail(
                    f"{actor} {method} {path} key {key!r}: answer at t={answer.get('t')} "
                    f"({answer['status']}, replayed={answer.get('replayed')}) differs from the "
                    f"first final one ({reference[0]}): {_short(answer.get('body'))} vs "
                    f"{_short(reference[1])}"
                )
                break
        else:
            user_id = users.get(actor)
            kept = stored.get((user_id, key)) if user_id is not None else None
            if kept is not None and kept != reference:
                inv.fail(
                    f"{actor} {method} {path} key {key!r}: final answer {reference[0]} "
                    f"{_short(reference[1])} differs from the stored one {kept[0]} "
                    f"{_short(kept[1])}"
                )
    return inv


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- payments ------------------------------------------------------------------------------


def check_provider_charges(*, ledger: LedgerFile) -> Invariant:
    """At most one succeeded capture per capture key, and per payment reference."""
    inv = Invariant("provider_charges")
    install = install_id()
    if install is None or not ledger.exists():
        if install is not None:
            inv.fail(f"no provider ledger at {ledger.path}")
        return inv
    prefix = f"{install}:"
    per_key = ledger.query(
        "SELECT key, COUNT(*) AS n FROM operations WHERE kind = 'capture' "
        "AND status = 'succeeded' AND substr(key, 1, ?) = ? GROUP BY key",
        (len(prefix), prefix),
    )
    inv.checked = len(per_key)
    for row in per_key:
        if row["n"] > 1:
            inv.fail(f"{row['n']} charges at the provider under capture key {row['key']}")
    per_reference = ledger.query(
        "SELECT reference, COUNT(DISTINCT key) AS n, group_concat(key) AS keys FROM operations "
        "WHERE kind = 'capture' AND status = 'succeeded' AND substr(key, 1, ?) = ? "
        "GROUP BY reference",
        (len(prefix), prefix),
    )
    for row in per_reference:
        if row["n"] > 1:
            inv.fail(f"payment {row['reference']} charged under {row['n']} keys: {row['keys']}")
        expected = f"{install}:{row['reference']}:capture"
        for key in (row["keys"] or "").split(","):
            if key != expected:
                inv.fail(f"capture key {key} is not the derived key {expected}")
    return inv


def check_captured_total(*, initial: dict) -> Invariant:
    """A paid order's payment captured Σ unit_price × quantity_confirmed; any other order 0."""
    inv = Invariant("captured_equals_confirmed")
    since = int(initial.get("max_order_number", 0))
    for number, status, was_paid, lines_total, captured in rows(
        "SELECT o.number, o.status, "
        "  (o.status IN ('confirmed', 'partially_confirmed', 'cancelling') OR EXISTS ("
        "    SELECT 1 FROM orders_compensationstep st WHERE st.order_id = o.id "
        "    AND st.kind = 'cancellation')), "
        "  (SELECT COALESCE(SUM(l.unit_price * l.quantity_confirmed), 0) "
        "   FROM orders_orderline l WHERE l.order_id = o.id), "
        "  COALESCE(p.amount_captured, 0) "
        "FROM orders_order o LEFT JOIN payments_payment p ON p.id = o.payment_id "
        "WHERE o.number > %s ORDER BY o.number",
        [since],
    ):
        inv.checked += 1
        expected = Decimal(lines_total) if was_paid else Decimal(0)
        if Decimal(captured) != expected:
            inv.fail(f"order {number} ({status}): captured {captured}, confirmed total {expected}")
    return inv


def check_refunded(*, ledger: LedgerFile) -> Invariant:
    """Refunded ≤ captured: per payment in the shop's books and per capture at the provider."""
    inv = Invariant("refunded_le_captured")
    for reference, captured, refunded, succeeded in rows(
        "SELECT p.reference, p.amount_captured, p.amount_refunded, "
        "  (SELECT COALESCE(SUM(r.amount), 0) FROM payments_refund r "
        "   WHERE r.payment_id = p.id AND r.status = 'succeeded') "
        "FROM payments_payment p ORDER BY p.reference"
    ):
        inv.checked += 1
        if refunded > captured or succeeded > captured:
            inv.fail(
                f"payment {reference}: captured {captured}, refunded {refunded} "
                f"(succeeded refunds sum to {succeeded})"
            )
    install = install_id()
    if install is not None and ledger.exists():
        prefix = f"{install}:"
        for row in ledger.query(
            "SELECT c.key, c.reference, c.amount, "
            "  (SELECT group_concat(r.amount, ' ') FROM operations r WHERE r.parent_key = c.key "
            "   AND r.kind = 'refund' AND r.status = 'succeeded') AS refunds "
            "FROM operations c WHERE c.kind = 'capture' AND c.status = 'succeeded' "
            "AND substr(c.key, 1, ?) = ?",
            (len(prefix), prefix),
        ):
            inv.checked += 1
            refunded = sum((Decimal(a) for a in (row["refunds"] or "").split()), Decimal(0))
            if refunded > Decimal(row["amount"]):
                inv.fail(
                    f"provider: {row['reference']} captured {row['amount']}, refunded {refunded}"
                )
    return inv


def check_reconciliation(*, ledger: LedgerFile) -> Invariant:
    """payments.reconciliation on the provider's ledger file: no difference."""
    from payments.reconciliation import reconcile_payments

    inv = Invariant("reconciliation_clean")
    if install_id() is not None and not ledger.exists():
        inv.fail(f"no provider ledger at {ledger.path}")
        return inv
    report = reconcile_payments(gateway=ledger)  # type: ignore[arg-type]
    inv.checked = max(report.provider_operations, report.shop_transactions)
    for difference in report.differences:
        inv.fail(f"{difference.kind} {difference.key}: {difference.detail}")
    return inv


def check_cancelled_refunded() -> Invariant:
    """A `cancelled` order refunded everything it captured: amount refunded = amount captured.

    Both the payment's `amount_refunded` and the sum of its succeeded refund
    rows, so a cancellation that refunded `captured − a refund in progress`
    (and that refund then failed) is caught even when the provider agrees
    with the shop (reconciliation clean).
    """
    inv = Invariant("cancelled_refunded_in_full")
    for number, captured, refunded, succeeded in rows(
        "SELECT o.number, p.amount_captured, p.amount_refunded, "
        "  (SELECT COALESCE(SUM(r.amount), 0) FROM payments_refund r "
        "   WHERE r.payment_id = p.id AND r.status = 'succeeded') "
        "FROM orders_order o JOIN payments_payment p ON p.id = o.payment_id "
        "WHERE o.status = 'cancelled' ORDER BY o.number"
    ):
        inv.checked += 1
        if refunded != captured or succeeded != captured:
            inv.fail(
                f"order {number} is cancelled: captured {captured}, refunded {refunded} "
                f"(succeeded refunds sum to {succeeded})"
            )
    return inv


def check_return_refunds(*, initial: dict) -> Invariant:
    """A completed return's `refund_amount` is what it refunded, and at most its lines' value.

    The full rule is refund = min(its lines' value, what was refundable when
    its refund step ran); what was refundable then is stored nowhere (the
    budget moves with every refund, and concurrent reservations are ordered
    by the payment row's lock, not by any stored time), so this checks what
    the stored data decides: refund_amount = Σ the succeeded refunds its
    refund step asked for (origin `return`, reason `return <id>`) ≤ its
    lines' value; refunded ≤ captured per order is `refunded_le_captured`.
    """
    inv = Invariant("return_refund_within_value")
    since = int(initial.get("max_order_number", 0))
    for return_id, number, refund_amount, value, refunded in rows(
        "SELECT rr.id::text, o.number, rr.refund_amount, "
        "  (SELECT COALESCE(SUM(ol.unit_price * rl.quantity), 0) FROM orders_returnline rl "
        "   JOIN orders_orderline ol ON ol.id = rl.order_line_id "
        "   WHERE rl.order_return_id = rr.id), "
        "  (SELECT COALESCE(SUM(r.amount), 0) FROM payments_refund r "
        "   WHERE r.payment_id = o.payment_id AND r.origin = 'return' "
        "   AND r.reason = 'return ' || rr.id::text AND r.status = 'succeeded') "
        "FROM orders_returnrequest rr JOIN orders_order o ON o.id = rr.order_id "
        "WHERE rr.status = 'completed' AND o.number > %s ORDER BY o.number, rr.id",
        [since],
    ):
        inv.checked += 1
        if refund_amount != refunded:
            inv.fail(
                f"return {return_id} (order {number}): refund_amount {refund_amount}, "
                f"its succeeded refunds sum to {refunded}"
            )
        if not 0 <= refund_amount <= value:
            inv.fail(
                f"return {return_id} (order {number}): refund_amount {refund_amount}, "
                f"its lines' value {value}"
            )
    return inv


# -- stock ---------------------------------------------------------------------------------


def _adjusted_skus(*, since: str | None) -> set[str]:
    """Skus whose stock staff adjusted (keyed `stock.adjust`, 2xx) since the snapshot."""
    if since is None:
        return set()
    return {
        path.rstrip("/").split("/")[-2]
        for (path,) in rows(
            "SELECT request_path FROM idempotency_idempotencykey WHERE operation = 'stock.adjust' "
            "AND response_status BETWEEN 200 AND 299 AND created_at > %s::timestamptz",
            [since],
        )
    }


def check_stock_balance(*, initial: dict) -> Invariant:
    """on hand = initial − sold + returned, per sku, counted since the snapshot."""
    inv = Invariant("stock_balance")
    start = initial.get("stock", {})
    adjusted = _adjusted_skus(since=initial.get("taken_at"))
    committed, restocked = _committed_by_sku(), _restocked_by_sku()
    for sku, (on_hand, _reserved) in sorted(_stock_by_sku().items()):
        inv.checked += 1
        if sku in adjusted or sku not in start:
            # Not silently passed: an adjustment's delta is stored nowhere, so it cannot be judged.
            why = "staff adjusted its stock" if sku in adjusted else "created after the snapshot"
            inv.fail(f"{sku}: {why} during the run; initial − sold + returned cannot be judged")
            continue
        before = start[sku]
        sold = committed.get(sku, 0) - before["committed"]
        returned = restocked.get(sku, 0) - before["restocked"]
        expected = before["on_hand"] - sold + returned
        if on_hand != expected:
            inv.fail(
                f"{sku}: on hand {on_hand}, expected {expected} "
                f"(initial {before['on_hand']} − sold {sold} + returned {returned})"
            )
    return inv


def check_stock_reserved() -> Invariant:
    """reserved = Σ held reservation flags per stock item; nothing negative."""
    inv = Invariant("stock_reserved_non_negative")
    for sku, on_hand, reserved, held in rows(
        "SELECT p.sku, s.on_hand, s.reserved, "
        "  (SELECT COALESCE(SUM(r.quantity), 0) FROM inventory_reservation r "
        "   WHERE r.stock_id = s.id AND r.state = 'held') "
        "FROM inventory_stockitem s JOIN inventory_product p ON p.id = s.product_id "
        "ORDER BY p.sku"
    ):
        inv.checked += 1
        if reserved != held:
            inv.fail(f"{sku}: reserved {reserved}, held flags {held}")
        if on_hand < 0 or reserved < 0 or on_hand < reserved:
            inv.fail(f"{sku}: on hand {on_hand}, reserved {reserved} (negative availability)")
    return inv


def expired_holds() -> list[tuple]:
    """Held flags whose expiry has passed by the database clock."""
    return rows(
        "SELECT r.id::text, p.sku, r.quantity, r.expires_at, now() - r.expires_at "
        "FROM inventory_reservation r JOIN inventory_stockitem s ON s.id = r.stock_id "
        "JOIN inventory_product p ON p.id = s.product_id "
        "WHERE r.state = 'held' AND r.expires_at < now() ORDER BY r.expires_at"
    )


def check_reservations_expiry() -> Invariant:
    """No reservation flag still held past its expiry (database clock)."""
    inv = Invariant("no_held_reservation_past_expiry")
    inv.checked = int(scalar("SELECT COUNT(*) FROM inventory_reservation WHERE state = 'held'"))
    for reservation_id, sku, quantity, expires_at, late in expired_holds():
        inv.fail(f"reservation {reservation_id} ({sku} × {quantity}) held {late} past {expires_at}")
    return inv


# -- events --------------------------------------------------------------------------------


def _json(value: Any) -> Any:
    """A jsonb column read by a raw cursor (Django's psycopg loads it as text)."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def _handled_messages() -> list[tuple]:
    return [
        (message_id, event_type, _json(payload), published, attention)
        for message_id, event_type, payload, published, attention in rows(
            "SELECT id::text, event_type, payload, done_at IS NOT NULL, needs_attention "
            "FROM idempotency_outboxmessage WHERE event_type = ANY(%s) ORDER BY created_at, id",
            [list(HANDLED_TYPES)],
        )
    ]


def _deliveries() -> dict[tuple[str, str], tuple[bool, bool]]:
    return {
        (consumer, message_id): (done, attention)
        for consumer, message_id, done, attention in rows(
            "SELECT consumer, message_id::text, done_at IS NOT NULL, needs_attention "
            "FROM idempotency_delivery"
        )
    }


def _check_mails_once(inv: Invariant, deliveries: dict) -> None:
    """The e-mails consumer: a done delivery is in its inbox once, with at most one mail row.

    Only where the consumer ran (its delivery rows exist; SHOP_EMAILS may be off). A
    mail row needs its event's delivery done: it commits with the inbox row and
    `done_at` (shop.emails); the unique message id keeps it to one.
    """
    inbox: dict[str, int] = defaultdict(int)
    for message_id, n in rows(
        "SELECT message_id, COUNT(*) FROM idempotency_inboxmessage WHERE consumer = %s "
        "GROUP BY message_id",
        [EMAILS_CONSUMER],
    ):
        inbox[message_id] = n
    mails: dict[str, int] = defaultdict(int)
    for message_id, n in rows("SELECT message_id, COUNT(*) FROM shop_mail GROUP BY message_id"):
        mails[message_id] = n
    for (consumer, message_id), (done, _attention) in sorted(deliveries.items()):
        if consumer != EMAILS_CONSUMER:
            continue
        inv.checked += 1
        claims, written = inbox.get(message_id, 0), mails.get(message_id, 0)
        if done and (claims != 1 or written > 1):
            inv.fail(f"emails: {message_id} delivered, inbox {claims}×, {written} mail rows")
        elif not done and (claims or written):
            inv.fail(f"emails: {message_id} not delivered, inbox {claims}×, {written} mail rows")
    delivered = {m for (c, m) in deliveries if c == EMAILS_CONSUMER}
    for message_id in sorted(set(mails) - delivered):
        inv.fail(f"emails: mail row for {message_id}, which has no delivery")


def check_events_once(*, ledger: LedgerFile) -> Invariant:
    """Each event applied exactly once per consumer (inbox, loyalty's applied ids, webhooks)."""
    inv = Invariant("events_applied_once")
    deliveries = _deliveries()
    inbox: dict[str, int] = defaultdict(int)
    for message_id, n in rows(
        "SELECT message_id, COUNT(*) FROM idempotency_inboxmessage WHERE consumer = %s "
        "GROUP BY message_id",
        ["purchase_history"],
    ):
        inbox[message_id] = n
    applied: dict[tuple[int, str], int] = defaultdict(int)
    for user_id, event_id, n in rows(
        "SELECT a.user_id, e->>'id', COUNT(*) FROM shop_loyaltyaccount a, "
        "jsonb_array_elements(a.applied) e GROUP BY a.user_id, e->>'id'"
    ):
        applied[(user_id, event_id)] = n
    messages = _handled_messages()
    known = {message_id for message_id, *_ in messages}
    for message_id, event_type, payload, published, _attention in messages:
        owner = payload.get("owner_id") if isinstance(payload, dict) else None
        for consumer in CONSUMERS:
            inv.checked += 1
            delivery = deliveries.get((consumer, message_id))
            if delivery is None:
                if published:
                    inv.fail(f"{consumer}: {event_type} {message_id} published, no delivery row")
                continue
            done, _ = delivery
            if consumer == "purchase_history":
                count = inbox.get(message_id, 0)
            else:
                count = applied.get((owner, message_id), 0) if isinstance(owner, int) else 0
            if done and count != 1:
                inv.fail(f"{consumer}: {event_type} {message_id} delivered, applied {count} times")
            elif not done and count:
                inv.fail(f"{consumer}: {event_type} {message_id} not delivered, applied {count}×")
    for message_id in sorted(set(inbox) - known):
        inv.fail(f"purchase_history: inbox has {message_id}, which is no outbox event")
    for (user_id, event_id), _n in sorted(applied.items()):
        if event_id not in known:
            inv.fail(f"loyalty: user {user_id} applied {event_id}, which is no outbox event")
    _check_mails_once(inv, deliveries)
    # The provider's webhooks: every event it delivered (answered 2xx) is in the inbox once.
    if ledger.exists():
        stored = {
            message_id
            for (message_id,) in rows(
                "SELECT message_id FROM idempotency_inboxmessage WHERE consumer = %s",
                [WEBHOOK_CONSUMER],
            )
        }
        install = install_id() or ""
        for row in ledger.query(
            "SELECT id, type, operation_key FROM events WHERE delivered_at IS NOT NULL "
            "AND substr(operation_key, 1, ?) = ?",
            (len(install) + 1, f"{install}:"),
        ):
            inv.checked += 1
            if row["id"] not in stored:
                inv.fail(f"webhook {row['type']} {row['id']} delivered, not in the inbox")
    return inv


def _points(lines: Any, quantity_field: str) -> int:
    total = 0
    for line in lines if isinstance(lines, list) else []:
        price = Decimal(str(line.get("unit_price", "0")))
        total += int(price.to_integral_value(rounding=ROUND_FLOOR)) * int(
            line.get(quantity_field, 0)
        )
    return total


def expected_loyalty() -> dict[str, int]:
    """Points per user from the distinct events loyalty has taken (its delivery done).

    The contract's rules, per order: the first confirmation earns
    floor(unit_price) × quantity_confirmed, a completed return takes back its
    units' points, a cancellation takes back what is left; in event order.
    """
    done = {
        message_id
        for (message_id,) in rows(
            "SELECT message_id::text FROM idempotency_delivery "
            "WHERE consumer = 'loyalty' AND done_at IS NOT NULL"
        )
    }
    per_order: dict[tuple[Any, Any], dict[str, Any]] = {}
    for message_id, event_type, payload, _published, _attention in _handled_messages():
        if message_id not in done or not isinstance(payload, dict):
            continue
        owner, order_id = payload.get("owner_id"), payload.get("order_id")
        tally = per_order.setdefault(
            (owner, order_id), {"earned": 0, "taken": 0, "earned_by": None, "cancelled": False}
        )
        if event_type in ("order.confirmed", "order.partially_confirmed"):
            if tally["earned_by"] is None and not tally["cancelled"]:
                tally["earned"] = _points(payload.get("lines"), "quantity_confirmed")
                tally["earned_by"] = message_id
        elif event_type == "return.completed":
            tally["taken"] += _points(payload.get("lines"), "quantity")
        elif not tally["cancelled"]:
            tally["taken"] += max(tally["earned"] - tally["taken"], 0)
            tally["cancelled"] = True
    balances: dict[str, int] = defaultdict(int)
    for (owner, _order), tally in per_order.items():
        balances[str(owner)] += tally["earned"] - tally["taken"]
    return dict(balances)


def check_loyalty(*, initial: dict) -> Invariant:
    """Each shopper's points = what they had + the points of the distinct events since."""
    inv = Invariant("loyalty_equals_events")
    start = initial.get("loyalty", {})
    expected = expected_loyalty()
    balances = _loyalty_balances()
    for user in sorted(set(expected) | set(balances) | set(start), key=str):
        inv.checked += 1
        before = start.get(user, {"balance": 0, "expected": 0})
        want = before["balance"] + expected.get(user, 0) - before["expected"]
        have = balances.get(user, 0)
        if have != want:
            inv.fail(f"user {user}: {have} points, the events since the snapshot make {want}")
    return inv


def check_history(*, initial: dict) -> Invariant:
    """Purchase history per (order, sku) = confirmed − returned, 0 once cancelled."""
    inv = Invariant("history_equals_orders")
    since = int(initial.get("max_order_number", 0))
    expected: dict[tuple[str, str], tuple[int, int]] = {}
    for order_id, owner_id, sku, confirmed, returned, cancelled in rows(
        "SELECT o.id::text, o.owner_id, l.sku, l.quantity_confirmed, "
        "  (SELECT COALESCE(SUM(rl.quantity), 0) FROM orders_returnline rl "
        "   WHERE rl.order_line_id = l.id AND EXISTS (SELECT 1 FROM orders_compensationstep st "
        "     WHERE st.order_return_id = rl.order_return_id AND st.name IN ('history', 'loyalty') "
        "     AND st.done_at IS NOT NULL)), "
        "  EXISTS (SELECT 1 FROM orders_compensationstep st WHERE st.order_id = o.id "
        "    AND st.kind = 'cancellation' AND st.name IN ('history', 'loyalty') "
        "    AND st.done_at IS NOT NULL) "
        "FROM orders_order o JOIN orders_orderline l ON l.order_id = o.id "
        "WHERE o.number > %s AND l.quantity_confirmed > 0 AND (o.status = ANY(%s) "
        "  OR EXISTS (SELECT 1 FROM orders_compensationstep st WHERE st.order_id = o.id "
        "    AND st.kind = 'cancellation'))",
        [since, [*CONFIRMED_STATUSES, "cancelling"]],
    ):
        net = 0 if cancelled else max(confirmed - returned, 0)
        expected[(order_id, sku)] = (owner_id, net)
    actual = {
        (order_id, sku): (user_id, quantity)
        for order_id, sku, user_id, quantity in rows(
            "SELECT h.order_id, h.sku, h.user_id, h.quantity FROM shop_purchasehistoryline h "
            "JOIN orders_order o ON o.id::text = h.order_id WHERE o.number > %s",
            [since],
        )
    }
    for (order_id, sku), (owner_id, net) in sorted(expected.items()):
        inv.checked += 1
        have = actual.get((order_id, sku))
        if have is None:
            inv.fail(f"order {order_id} {sku}: no history line (expected {net})")
        elif have != (owner_id, net):
            inv.fail(
                f"order {order_id} {sku}: history user {have[0]} quantity {have[1]}, "
                f"expected user {owner_id} quantity {net}"
            )
    for (order_id, sku), (_user, quantity) in sorted(actual.items()):
        if (order_id, sku) not in expected and quantity:
            inv.checked += 1
            inv.fail(f"order {order_id} {sku}: history shows {quantity}, the order sold nothing")
    return inv


# -- due work, keys, broker ------------------------------------------------------------------


def _due_models() -> list[type[DueWork]]:
    from idempotency.models import Delivery, OutboxMessage
    from orders.models import CompensationStep
    from payments.models import PaymentSettlement, Refund
    from shop.models import Mail

    return [OutboxMessage, Delivery, PaymentSettlement, Refund, CompensationStep, Mail]


def check_due_budget() -> Invariant:
    """No due-work row at its attempt budget unless flagged needs_attention with a reason."""
    inv = Invariant("due_work_budget")
    for model in _due_models():
        table = connection.ops.quote_name(model._meta.db_table)
        budget = model.due_policy().max_attempts
        inv.checked += int(scalar(f"SELECT COUNT(*) FROM {table}"))
        for pk, attempts, error in rows(
            f"SELECT id::text, attempts, last_error FROM {table} WHERE done_at IS NULL "
            "AND NOT needs_attention AND attempts >= %s",
            [budget],
        ):
            inv.fail(f"{model.__name__} {pk}: {attempts}/{budget} attempts, not flagged ({error})")
        for (pk,) in rows(
            f"SELECT id::text FROM {table} WHERE needs_attention AND done_at IS NULL "
            "AND btrim(last_error) = ''"
        ):
            inv.fail(f"{model.__name__} {pk}: needs attention without a reason")
    return inv


def pending_work(*, holds: bool = False) -> dict[str, list[str]]:
    """What the system would still do by itself, by kind (empty lists: quiet).

    `holds`: an order awaiting the shopper's decision counts too, since its
    hold's expiry will write an event (orders.services.order_expire) at
    `reservation_expires_at`: the chaos run waits through every expiry, so
    none can land between its last wait and `verify`.
    """
    from idempotency.keys import registered_operations
    from orders.models import CompensationStep

    pending: dict[str, list[str]] = {}
    # Open keys the completer would finish (not those parked behind a settlement that
    # needs staff: the completer leaves them open on purpose).
    pending["open_keys"] = [
        f"{operation} {key} ({point})"
        for operation, key, point in rows(
            "SELECT k.operation, k.key, k.recovery_point FROM idempotency_idempotencykey k "
            "WHERE k.recovery_point <> 'finished' AND k.operation = ANY(%s) AND NOT EXISTS ("
            "  SELECT 1 FROM payments_paymentsettlement st "
            "  JOIN payments_paymenttransaction t ON t.id = st.transaction_id "
            "  WHERE t.payment_id::text = k.data->>'payment_id' AND st.needs_attention "
            "  AND st.done_at IS NULL) ORDER BY k.last_run_at",
            [sorted(registered_operations())],
        )
    ]
    for model in _due_models():
        table = connection.ops.quote_name(model._meta.db_table)
        where = "done_at IS NULL AND NOT needs_attention"
        if model is CompensationStep:
            # A step waiting for a sibling that needs staff is parked, not pending;
            # so is a cancellation's refund (and the steps after it) while a refund
            # of the order needs staff: it waits for their decision, then refunds.
            where += (
                " AND NOT EXISTS (SELECT 1 FROM orders_compensationstep f WHERE f.needs_attention"
                " AND f.name = s.after AND s.after <> '' AND f.done_at IS NULL"
                " AND ((s.kind = 'return' AND f.order_return_id = s.order_return_id)"
                "  OR (s.kind = 'cancellation' AND f.kind = 'cancellation'"
                "      AND f.order_id = s.order_id)))"
                " AND NOT (s.kind = 'cancellation' AND 'refund' IN (s.name, s.after)"
                "  AND EXISTS (SELECT 1 FROM payments_refund r"
                "   JOIN orders_order o ON o.payment_id = r.payment_id"
                "   WHERE o.id = s.order_id"
                "   AND (r.needs_attention OR r.status = 'needs_attention')))"
            )
        pending[model.__name__] = [
            f"{pk} (attempts {attempts}, due in {due:.0f} s)"
            for pk, attempts, due in rows(
                "SELECT s.id::text, s.attempts, "
                f"EXTRACT(EPOCH FROM s.next_attempt_at - now())::float FROM {table} s "
                f"WHERE {where} ORDER BY s.next_attempt_at LIMIT 50"
            )
        ]
    pending["expired_holds"] = [f"{r[0]} ({r[1]} × {r[2]})" for r in expired_holds()]
    if holds:
        pending["awaiting_decision"] = [
            f"order {number} (expires in {due:.0f} s)"
            for number, due in rows(
                "SELECT number, EXTRACT(EPOCH FROM reservation_expires_at - now())::float "
                "FROM orders_order WHERE status = 'awaiting_decision' "
                "ORDER BY reservation_expires_at LIMIT 50"
            )
        ]
    # On RabbitMQ wait only counts (peeking would take messages from the running workers).
    pending["broker"] = [m.describe() for m in broker_messages(peek=False) if not m.expendable]
    return pending


@dataclass(frozen=True)
class BrokerMessage:
    where: str  # queue name or "unacked"
    task: str
    task_id: str
    expires: str | None

    @property
    def expendable(self) -> bool:
        """A beat tick carrying an expiry: the worker drops it once expired (settings)."""
        return self.expires is not None and self.task in _beat_tasks()

    def describe(self) -> str:
        return f"{self.where}: {self.task} {self.task_id}"


def _beat_tasks() -> frozenset[str]:
    return frozenset(entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values())


def _queues() -> list[str]:
    from config.celery import app

    # Every declared queue (CELERY_TASK_QUEUES: one per kind of work), and the
    # default one should a task be published without a route.
    names = {queue.name for queue in app.conf.task_queues or ()}
    names.add(app.conf.task_default_queue or "celery")
    return sorted(names)


def _message(raw: Any, where: str) -> BrokerMessage:
    try:
        data = json.loads(raw) if isinstance(raw, bytes | str) else raw
        if isinstance(data, list):  # the unacked hash: [message, exchange, routing key]
            data = data[0]
        headers = data.get("headers") or {}
        return BrokerMessage(
            where=where,
            task=str(headers.get("task", "?")),
            task_id=str(headers.get("id", "?")),
            expires=headers.get("expires"),
        )
    except (ValueError, AttributeError, IndexError, TypeError):
        return BrokerMessage(where=where, task="?", task_id=str(raw)[:60], expires=None)


def broker_messages(*, peek: bool = True) -> list[BrokerMessage]:
    """Every message in the broker's queues (and Redis's unacked hash), without consuming any."""
    url = str(settings.CELERY_BROKER_URL)
    if urlparse(url).scheme in ("redis", "rediss"):
        return _redis_messages(url)
    return _amqp_messages(url, peek=peek)


def _redis_messages(url: str) -> list[BrokerMessage]:
    import redis

    client = redis.Redis.from_url(url)
    found: list[BrokerMessage] = []
    try:
        for queue in _queues():
            # kombu keeps priorities in separate lists: "<queue>" and "<queue>\x06\x16<n>".
            names = [queue.encode(), *client.scan_iter(match=f"{queue}\x06\x16*".encode())]
            for name in names:
                if client.type(name) != b"list":
                    continue
                label = name.decode(errors="replace").replace("\x06\x16", ":")
                found += [_message(raw, label) for raw in client.lrange(name, 0, -1)]
        for raw in client.hvals(UNACKED_KEY):
            found.append(_message(raw, "unacked"))
    finally:
        client.close()
    return found


def _amqp_messages(url: str, *, peek: bool) -> list[BrokerMessage]:
    """Messages ready in the queues; `peek`: read their headers (taken unacknowledged and
    given back when the channel closes), else count them only (no redelivery flag set)."""
    from amqp.exceptions import NotFound
    from kombu import Connection

    found: list[BrokerMessage] = []
    with Connection(url, connect_timeout=10) as conn:
        for queue in _queues():
            channel: Any = conn.channel()  # py-amqp's Channel
            try:
                _, count, _ = channel.queue_declare(queue=queue, passive=True)
                peeked = 0
                while peek and peeked < min(count, 200):
                    message = channel.basic_get(queue=queue, no_ack=False)
                    if message is None:
                        break
                    peeked += 1
                    headers = message.headers or {}
                    found.append(
                        BrokerMessage(
                            where=queue,
                            task=str(headers.get("task", "?")),
                            task_id=str(headers.get("id", "?")),
                            expires=headers.get("expires"),
                        )
                    )
                found += [BrokerMessage(queue, "?", "(not read)", None)] * (count - peeked)
            except NotFound:
                continue  # never declared: nothing in it (the channel is closed by the broker)
            finally:
                try:
                    channel.close()
                except Exception:  # noqa: BLE001 - closed by the broker already
                    pass
    return found


def check_broker() -> Invariant:
    """Nothing left in the broker: queues and Redis's unacked hash empty.

    Read twice, `BROKER_REREAD` seconds apart: a message is left over when it
    is there both times (with the workers still running, a doorbell rung a
    moment ago is on its way to one, not left). Beat ticks carrying an expiry
    are skipped: the worker drops them once expired (settings' `_beat_every`).
    """
    inv = Invariant("broker_empty")
    first = broker_messages()
    inv.checked = len(first)
    if not any(not m.expendable for m in first):
        return inv
    time.sleep(BROKER_REREAD)
    again = {(m.where, m.task_id) for m in broker_messages()}
    for message in first:
        if not message.expendable and (message.where, message.task_id) in again:
            inv.fail(f"left in the broker: {message.describe()}")
    return inv


def check_nothing_pending() -> Invariant:
    """Nothing the system would still do by itself: no open key, no pending due-work row."""
    inv = Invariant("nothing_pending")
    for kind, items in pending_work().items():
        if kind in ("broker", "expired_holds"):
            continue  # their own invariants
        inv.checked += 1
        for item in items:
            inv.fail(f"{kind}: {item}")
    return inv


def flagged_work() -> list[str]:
    """Everything waiting for a person: flagged due rows (any kind, the outbox too), refunds
    flagged or `needs_attention` (a decided one flagged again: the provider's late word),
    failed compensation steps, returns in `needs_attention`."""
    flagged = []
    for model in _due_models():
        table = connection.ops.quote_name(model._meta.db_table)
        for pk, error in rows(
            f"SELECT id::text, last_error FROM {table} WHERE needs_attention AND done_at IS NULL "
            "ORDER BY id"
        ):
            flagged.append(f"{model.__name__} {pk}: {error}")
    for pk, status, error in rows(
        "SELECT id::text, status, last_error FROM payments_refund "
        "WHERE (needs_attention OR status = 'needs_attention') "
        "AND NOT (needs_attention AND done_at IS NULL) ORDER BY id"  # those: in the loop above
    ):
        flagged.append(f"Refund {pk} ({status}): {error}")
    for pk, kind, name, error in rows(
        "SELECT id::text, kind, name, last_error FROM orders_compensationstep "
        "WHERE status = 'failed' AND done_at IS NULL AND NOT needs_attention ORDER BY id"
    ):
        flagged.append(f"CompensationStep {pk} ({kind} {name} failed): {error}")
    for (pk,) in rows(
        "SELECT id::text FROM orders_returnrequest WHERE status = 'needs_attention' ORDER BY id"
    ):
        flagged.append(f"ReturnRequest {pk}: needs attention")
    return flagged


def check_nothing_flagged() -> Invariant:
    """Nothing left waiting for a person once the liveness phase resolved what was offered."""
    inv = Invariant("nothing_needs_attention")
    inv.checked = len(_due_models()) + 2
    for item in flagged_work():
        inv.fail(item)
    return inv


# -- acknowledged writes (the database crashes and hangs) ------------------------------

# Per answer kind: the table its 2xx answer's `id` names, and the states that
# row may end in (None: any) given the state the answer reported.
CONFIRMED_OR_LATER = (*CONFIRMED_STATUSES, "cancelling", "cancelled")
# Tables without a status column (a shipment only exists or not).
STATELESS = frozenset({"orders_shipment"})
ACKNOWLEDGED = {
    "checkout": "orders_order",
    "decide": "orders_order",
    "cancel": "orders_order",
    "refund": "payments_refund",
    "shipment": "orders_shipment",
    "return_request": "orders_returnrequest",
    "return_receive": "orders_returnrequest",
}


def _allowed_states(kind: str, answered: Any) -> tuple[str, ...] | None:
    """The states a row may end in after a 2xx answer of `kind` that said `answered`."""
    if kind in ("checkout", "decide") and answered in CONFIRMED_STATUSES:
        return CONFIRMED_OR_LATER  # a cancellation may follow; nothing else undoes it
    if kind == "cancel" and answered in ("cancelling", "cancelled"):
        return ("cancelling", "cancelled")
    if kind == "return_receive":
        return ("processing", "completed", "needs_attention")  # received: never back
    return None


def check_acknowledged_writes(*, answers: list[dict]) -> Invariant:
    """Every 2xx the clients got is still in the database at the end (orders, their
    confirmation and cancellation, refunds, shipments, returns and their receipt),
    across every database crash, hang and partition of the run."""
    inv = Invariant("acknowledged_writes_kept")
    wanted: dict[str, dict[str, list[tuple[dict, tuple[str, ...] | None]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for answer in answers:
        kind, status, body = answer.get("kind"), answer.get("status"), answer.get("body")
        table = ACKNOWLEDGED.get(kind or "")
        if table is None or not isinstance(status, int) or not 200 <= status < 300:
            continue
        if not isinstance(body, dict) or not body.get("id"):
            continue
        wanted[table][str(body["id"])].append((answer, _allowed_states(kind, body.get("status"))))
    for table, by_id in wanted.items():
        # The table names come from ACKNOWLEDGED above, never from the answers.
        status = "NULL" if table in STATELESS else "status"
        found = dict(
            rows(f"SELECT id::text, {status} FROM {table} WHERE id::text = ANY(%s)", [list(by_id)])
        )
        for row_id, acks in sorted(by_id.items()):
            for answer, allowed in acks:
                inv.checked += 1
                what = f"{answer.get('kind')} {answer.get('status')} at {answer.get('t', 0):.1f}"
                if row_id not in found:
                    inv.fail(f"{what} ({answer.get('actor')}): {table} {row_id} does not exist")
                elif allowed is not None and found[row_id] not in allowed:
                    inv.fail(f"{what}: {table} {row_id} is {found[row_id]!r}, not one of {allowed}")
    return inv


def verify(*, files: RunFiles) -> list[Invariant]:
    """Run every invariant on the run's state; return their results."""
    initial = json.loads(files.initial.read_text()) if files.initial.exists() else {}
    answers = read_answers(files.answers)
    ledger = LedgerFile(files.provider)
    results = []
    for name, run in (
        ("orders_per_key", lambda: check_orders_per_key(initial=initial, answers=answers)),
        ("replays_equal_final", lambda: check_replays(answers=answers)),
        ("provider_charges", lambda: check_provider_charges(ledger=ledger)),
        ("captured_equals_confirmed", lambda: check_captured_total(initial=initial)),
        ("refunded_le_captured", lambda: check_refunded(ledger=ledger)),
        ("cancelled_refunded_in_full", check_cancelled_refunded),
        ("return_refund_within_value", lambda: check_return_refunds(initial=initial)),
        ("reconciliation_clean", lambda: check_reconciliation(ledger=ledger)),
        ("stock_balance", lambda: check_stock_balance(initial=initial)),
        ("stock_reserved_non_negative", check_stock_reserved),
        ("no_held_reservation_past_expiry", check_reservations_expiry),
        ("events_applied_once", lambda: check_events_once(ledger=ledger)),
        ("loyalty_equals_events", lambda: check_loyalty(initial=initial)),
        ("history_equals_orders", lambda: check_history(initial=initial)),
        ("due_work_budget", check_due_budget),
        ("nothing_pending", check_nothing_pending),
        ("nothing_needs_attention", check_nothing_flagged),
        ("broker_empty", check_broker),
        ("acknowledged_writes_kept", lambda: check_acknowledged_writes(answers=answers)),
    ):
        try:
            results.append(run())
        except Exception as exc:  # noqa: BLE001 - a check that cannot run is a failed check
            broken = Invariant(name)
            broken.fail(f"the check could not run: {type(exc).__name__}: {exc}")
            results.append(broken)
    if not files.initial.exists():
        results[0].fail(f"no {files.initial}: run `snapshot` before the workload")
    return results
