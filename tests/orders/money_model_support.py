"""Helpers of the model-based test of an order's money life (tests/orders/test_money_model.py).

The pieces a person or a process plays around the shop, each through what the
shop offers them: a worker (the task bodies, called here, one at a time), the
clock (time passes: every due row's times move back), the provider's webhooks
(the simulator's stored events, delivered to the real endpoint), and staff
(the services the admin calls, discovered per item, never a hard-coded path).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal

from django.apps import apps
from django.db import connection, models
from django.test import Client

from core.errors import ApplicationError
from devtools.simulator.webhooks import event_body
from idempotency.failpoints import hook
from orders.compensation import steps_retry_failed
from orders.models import CompensationStep
from payments import webhooks
from payments.capture_differs import (
    settlement_record_provider_capture,
    settlement_refund_difference,
)
from payments.models import PaymentSettlement, Refund, RefundStatus
from payments.refund_decisions import refund_record_failed, refund_record_outside, refund_retry_now
from payments.selectors import settlement_attention
from payments.settlement import settlement_retry_now
from payments.states import SettlementAttention

WEBHOOKS = "/api/v1/payments/webhooks/"
# The kinds of due work an order's money life makes (refunds, compensation
# steps, settlements of the capture): the clock moves their times.
MONEY_DUE_WORK: tuple[type[models.Model], ...] = (Refund, CompensationStep, PaymentSettlement)
# Tables kept between examples: what migrations made and nothing writes.
KEPT_TABLES = frozenset({"django_migrations", "django_content_type", "auth_permission"})


class WorkerKilled(BaseException):
    """The worker process died here (SIGKILL or `exit` failpoint), in-process.

    A BaseException, so no `except Exception` in the shop handles it: the
    open transaction rolls back (as the database does for a dead
    connection), nothing after this line runs, and the row is left for the
    sweeper, exactly as a kill leaves it. Unlike a real kill, `finally`
    blocks still run; the shop's money code has none that write.
    """


def reset_database() -> None:
    """Empty every table the shop writes (one TRUNCATE): each example starts from nothing.

    The installation row goes too, so the next example gets a new install id
    and reconciliation (which reads the provider's ledger by the install's
    key prefix) sees only that example's calls at the shared simulator.
    """
    kept = KEPT_TABLES
    tables = [
        t for t in connection.introspection.django_table_names(only_existing=True) if t not in kept
    ]
    quoted = ", ".join(connection.ops.quote_name(t) for t in tables)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {quoted} RESTART IDENTITY CASCADE")


def time_passes(hours: int = 2) -> None:
    """Move every time of the money's due rows back by `hours`: backoffs, leases, waits and
    the parked re-check (1 h) all run out, judged by the database clock as the shop does."""
    for model in MONEY_DUE_WORK:
        columns = [
            f.column
            for f in model._meta.concrete_fields
            if isinstance(f, models.DateTimeField) and apps.is_installed(model._meta.app_label)
        ]
        if not columns:
            continue
        sets = ", ".join(
            f"{connection.ops.quote_name(c)} = {connection.ops.quote_name(c)}"
            f" - make_interval(hours => %s)"
            for c in columns
        )
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {connection.ops.quote_name(model._meta.db_table)} SET {sets}",
                [hours] * len(columns),
            )


@contextlib.contextmanager
def worker_dies_at_statement(n: int | None) -> Iterator[list[int]]:
    """The worker dies just before its `n`-th SQL statement (None: it lives).

    Every statement counts, SAVEPOINTs included, so a death can land between
    any two transactions of an attempt, e.g. after one commit and before the
    next. Yields a one-item list: how many statements ran.
    """
    ran = [0]

    def wrapper(execute, sql, params, many, context):
        ran[0] += 1
        if n is not None and ran[0] == n:
            raise WorkerKilled(f"killed before statement {n}: {sql[:80]}")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield ran


@contextlib.contextmanager
def worker_dies_at_failpoint(name: str | None) -> Iterator[None]:
    """The worker dies at the named failpoint (in-process `exit`, see WorkerKilled)."""
    if name is None:
        yield
        return

    def die(_name: str) -> None:
        raise WorkerKilled(f"killed at failpoint {name}")

    with hook(name, die):
        yield


@contextlib.contextmanager
def failpoint_raises(name: str | None) -> Iterator[None]:
    """The failpoint's `raise` action (FailpointError: a transient failure the shop handles)."""
    if name is None:
        yield
        return
    from idempotency.failpoints import FailpointError

    def fail(_name: str) -> None:
        raise FailpointError(f"failpoint {name} fired")

    with hook(name, fail):
        yield


def deliver_webhook(row: dict) -> int:
    """Deliver one stored simulator event to the shop's endpoint, signed now; return the status."""
    body = event_body(row)
    from django.conf import settings

    header = webhooks.sign(
        secret=settings.PAYMENTS_WEBHOOK_SECRET, timestamp=int(time.time()), body=body
    )
    response = Client().post(
        WEBHOOKS, data=body, content_type="application/json", HTTP_SHOP_SIGNATURE=header
    )
    return response.status_code


# -- staff: the needs-attention items of one order and the actions that end them ---------------


@dataclass(frozen=True)
class Item:
    """One thing waiting for a person: what it is (kind, id) and why."""

    kind: str  # refund | step | settlement
    pk: object
    reason: str


@dataclass(frozen=True)
class Action:
    name: str
    run: Callable[[], object]


def attention_items(*, payment_id, order_id) -> list[Item]:
    """Everything of this order that waits for a person, as the admin's lists show it."""
    items = [
        Item("refund", r.id, r.last_error)
        for r in Refund.objects.filter(payment_id=payment_id, status=RefundStatus.NEEDS_ATTENTION)
        .order_by("created_at", "id")
        .only("id", "last_error")
    ]
    items += [
        Item("step", s.id, f"{s.kind} {s.name} {s.status}: {s.last_error}")
        for s in CompensationStep.objects.filter(order_id=order_id, done_at__isnull=True)
        .filter(models.Q(needs_attention=True) | models.Q(status="failed"))
        .order_by("id")
    ]
    items += [
        Item("settlement", s.id, s.last_error)
        for s in PaymentSettlement.objects.filter(
            transaction__payment_id=payment_id, done_at__isnull=True, needs_attention=True
        ).order_by("id")
    ]
    return items


def provider_moved(simulator, key: str) -> bool:
    """The provider's ledger has a succeeded operation under `key`."""
    return any(op["key"] == key and op["status"] == "succeeded" for op in simulator.ledger(key))


def offered_actions(item: Item, *, simulator, by, preference: tuple[str, ...]) -> list[Action]:
    """The actions the admin offers for `item`, in staff's order of preference.

    Refunds: "Retry now", and — only after reconciling, as docs/payments.md
    tells staff — "Refunded outside the shop" / "Record as failed" when the
    provider's ledger shows it did not refund under the key (a person never
    records as failed or outside money the provider reports it moved).
    Compensation steps: "Retry now" (= "Retry failed steps" per row).
    Settlements: "Retry now"; a captured amount that differs: "Record what the provider
    captured", and "Refund the difference" when it took more.
    """
    if item.kind == "refund":
        refund = Refund.objects.get(id=item.pk)
        available = {"retry": lambda: refund_retry_now(refund_id=item.pk, by=by)}
        if not provider_moved(simulator, refund.provider_key):
            available["outside"] = lambda: refund_record_outside(refund_id=item.pk, by=by)
            available["failed"] = lambda: refund_record_failed(refund_id=item.pk, by=by)
        return [Action(name, available[name]) for name in preference if name in available]
    if item.kind == "step":
        return [Action("retry steps", lambda: steps_retry_failed(step_ids=[item.pk], by=by))]
    if item.kind == "settlement":
        # As the admin offers them (`backoffice.needs_attention.ACTIONS`, by the item's status).
        settlement = PaymentSettlement.objects.select_related("transaction").get(id=item.pk)
        why = settlement_attention(settlement=settlement)
        available = {
            "retry": lambda: not settlement_retry_now(settlement_id=item.pk, by=by).needs_attention
        }
        if why in (SettlementAttention.CAPTURED_MORE, SettlementAttention.CAPTURED_LESS):
            available["record"] = lambda: settlement_record_provider_capture(
                settlement_id=item.pk, by=by
            )
        if why == SettlementAttention.CAPTURED_MORE:
            available["refund_difference"] = lambda: settlement_refund_difference(
                settlement_id=item.pk, by=by
            )
        return [Action(name, available[name]) for name in preference if name in available]
    raise AssertionError(f"unknown item {item}")


def take(action: Action) -> bool:
    """Take one staff action; True if it changed something (a refusal or a no-op: False)."""
    try:
        result = action.run()
    except ApplicationError:
        return False  # refused, with a problem naming what to do instead
    if isinstance(result, bool | int):
        return bool(result)
    return result is not None


def money(value) -> Decimal:
    return Decimal(value).quantize(Decimal("0.01"))
