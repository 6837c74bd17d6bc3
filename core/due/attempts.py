"""One attempt at a row of due work: begun, fenced, failed, flagged, done, or retried by staff."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection, models, transaction
from django.db.models.functions import Now

from .doorbell import ring_after_commit
from .rows import (
    ATTEMPT_OWNER_PREFIX,
    DueWork,
    attempt_running,
    default_owner,
    free_lease_values,
    touch_values,
    truncate_error,
)


@dataclass(frozen=True)
class Attempt:
    """What `attempt_begin` came to: the attempt this runner took, or why none."""

    number: int = 0  # 1-based attempt this runner took; 0: none taken
    budget_spent: bool = False  # the row has used its attempts: flag it, do not work
    token: str = ""  # the fencing token: this attempt's `lease_owner` while it holds the row
    pk: Any = None  # the row this attempt is of

    @property
    def taken(self) -> bool:
        return self.number > 0


class Ended(enum.Enum):
    """How `attempt_failed` ended the attempt. Truthy only for ATTENTION (the budget is spent)."""

    RETRY = "retry"  # recorded; the row is due again after the backoff
    ATTENTION = "attention"  # recorded; the budget is spent: needs_attention
    REFUSED = "refused"  # nothing written: the attempt is stale (or the row done / flagged)

    def __bool__(self) -> bool:
        return self is Ended.ATTENTION


def attempt_token(number: int) -> str:
    """Return a fresh fencing token for attempt `number` (unique; names the runner)."""
    return f"{ATTEMPT_OWNER_PREFIX}{number} {uuid.uuid4().hex[:12]} {default_owner()}"[:100]


def fence(rows: models.QuerySet, attempt: Attempt | None) -> models.QuerySet:
    """Narrow `rows` to those `attempt` still holds (its number and token); None: unfenced.

    A write through the result updates nothing once the attempt is stale:
    its lease ran out and another attempt began, staff retried or flagged the
    row, or it was freed (failed, done). The row count tells the caller.
    """
    if attempt is None:
        return rows
    if not attempt.taken:
        raise ValueError("an attempt that was not taken holds no row")
    return rows.filter(attempts=attempt.number, lease_owner=attempt.token)


def attempt_begin(model: type[DueWork], *, pk, values: dict[str, Any] | None = None) -> Attempt:
    """Count one attempt, take its lease and schedule the next before the work calls out.

    The conditional UPDATE (same attempt count, still due, no attempt's lease
    running) lets exactly one of several concurrent runners (sweeper, bell,
    redelivered message) take the attempt, and refuses every runner while an
    earlier attempt may still be running. It takes the attempt's lease for
    `policy.attempt_lease_seconds` (its worst case; a sweeper's lease is taken
    over, a row rung by the bell gets one here) with a fresh fencing token,
    and pushes `next_attempt_at` back by the backoff. It commits before the
    work: a runner killed mid-work leaves the row due once its lease runs out.
    `values` are the kind's own columns set in the same UPDATE (a status).
    """
    row = model.objects.filter(pk=pk).values("attempts", "done_at", "needs_attention").first()
    if row is None or row["done_at"] is not None or row["needs_attention"]:
        return Attempt()
    policy = model.due_policy()
    if row["attempts"] >= policy.max_attempts:
        if model.objects.filter(pk=pk).filter(attempt_running()).exists():
            return Attempt()  # the last attempt is still running: it decides
        return Attempt(budget_spent=True)
    number = row["attempts"] + 1
    token = attempt_token(number)
    taken = (
        model.objects.filter(pk=pk, attempts=row["attempts"], next_attempt_at__lte=Now())
        .pending()
        .exclude(attempt_running())
        .update(
            **{
                **touch_values(model),
                **(values or {}),
                "attempts": number,
                "next_attempt_at": Now() + timedelta(seconds=policy.backoff(number)),
                "lease_owner": token,
                "lease_expires_at": Now() + timedelta(seconds=policy.attempt_lease_seconds),
            }
        )
    )
    return Attempt(number=number, token=token, pk=pk) if taken else Attempt()


def attempt_failed(
    model: type[DueWork],
    *,
    pk,
    error: object,
    attention_reason: str | None = None,
    attempt: Attempt | None = None,
    attention_values: dict[str, Any] | None = None,
    retry_values: dict[str, Any] | None = None,
) -> Ended:
    """Record why an attempt failed and free the lease, in one UPDATE; say how it ended.

    The next attempt is already scheduled (by `attempt_begin`). When the
    attempts reach the budget the row gets `needs_attention`, with the reason
    in `last_error` (`attention_reason`, or a generic one), and
    `attention_values`; otherwise `retry_values`: the kind's status moves in
    the same statement as the flag. ATTENTION (truthy) tells the caller to
    write its own event, in the caller's transaction if it has one open.
    With `attempt`, a stale attempt writes nothing (REFUSED).
    """
    budget = model.due_policy().max_attempts
    with transaction.atomic():
        row = (
            fence(model.objects.filter(pk=pk).pending(), attempt)
            .select_for_update()
            .values("attempts")
            .first()
        )
        if row is None:
            return Ended.REFUSED
        spent = row["attempts"] >= budget
        if spent:
            reason = attention_reason or f"attempt budget spent ({budget} attempts): {error}"
            fields = {"needs_attention": True, "last_error": truncate_error(reason)}
            fields.update(attention_values or {})
        else:
            fields = {"last_error": truncate_error(error), **(retry_values or {})}
        model.objects.filter(pk=pk).update(
            **{**free_lease_values(), **touch_values(model), **fields}
        )
    return Ended.ATTENTION if spent else Ended.RETRY


def flag_attention(
    model: type[DueWork],
    *,
    pk,
    reason: str,
    only_if_attempts_at_least: int | None = None,
    attempt: Attempt | None = None,
    values: dict[str, Any] | None = None,
) -> bool:
    """Stop retrying the row until staff retry it; return True if this call flagged it.

    `values` (the kind's status) change in the same UPDATE; with `attempt`,
    only while that attempt still holds the row.
    """
    rows = fence(model.objects.filter(pk=pk).pending(), attempt)
    if only_if_attempts_at_least is not None:
        rows = rows.filter(attempts__gte=only_if_attempts_at_least)
    return bool(
        rows.update(
            **{
                **free_lease_values(),
                **touch_values(model),
                **(values or {}),
                "needs_attention": True,
                "last_error": truncate_error(reason),
            }
        )
    )


def mark_done(
    model: type[DueWork],
    *,
    pk,
    attempt: Attempt | None = None,
    values: dict[str, Any] | None = None,
) -> bool:
    """Mark the row's work done (nothing more is due); return True if this call did it.

    With `attempt`, only while that attempt still holds the row.
    """
    rows = fence(model.objects.filter(pk=pk, done_at__isnull=True), attempt)
    return bool(
        rows.update(
            **{
                **free_lease_values(),
                **touch_values(model),
                **(values or {}),
                "done_at": Now(),
                "needs_attention": False,
            }
        )
    )


def retry_now(model: type[DueWork], *, pk) -> bool:
    """Give a row a fresh attempt budget, due now, and ring its bell after commit (staff action).

    Return True if the row was reopened (False when it is done already).
    """
    reopened = model.objects.filter(pk=pk, done_at__isnull=True).update(
        needs_attention=False,
        attempts=0,
        next_attempt_at=Now(),
        **free_lease_values(),
        **touch_values(model),
    )
    if reopened:
        ring_after_commit(model, pk)
    return bool(reopened)


# -- a ring's attempts, one statement each ----------------------------------------------


def _table(model: type[DueWork]) -> tuple[str, str, str]:
    """The kind's table, pk column and pk type, quoted for raw SQL."""
    meta = model._meta
    pk: Any = meta.pk  # a concrete model has a primary key, and it has a column
    return (
        connection.ops.quote_name(meta.db_table),
        connection.ops.quote_name(pk.column),
        pk.db_type(connection) or "bigint",
    )


def _touch_sql(model: type[DueWork]) -> str:
    return ", updated_at = now()" if touch_values(model) else ""


def attempts_begin(
    model: type[DueWork], *, pks: Sequence, lease_cap: float | None = None
) -> dict[Any, Attempt]:
    """Begin one attempt at each due row of a ring in one statement; return them by pk.

    As `attempt_begin` for each row (still due, budget left, no attempt's lease
    running; `next_attempt_at` pushed back by the backoff), with one fencing
    token for the ring. The ring's rows are worked in order, so the row at
    position k is leased for k attempt leases (at most `lease_cap` seconds):
    each lease covers the work before it. A row left out (not due, done,
    flagged, an attempt running, its budget spent) has no entry: the caller
    asks `attempts_spent` which of those have spent their budget.
    """
    ordered = list(dict.fromkeys(pks))
    if not ordered:
        return {}
    policy = model.due_policy()
    table, pk, pk_type = _table(model)
    token = f"{ATTEMPT_OWNER_PREFIX}ring {uuid.uuid4().hex[:12]} {default_owner()}"[:100]
    lease = policy.attempt_lease_seconds
    cap = lease * len(ordered) if lease_cap is None else max(lease, lease_cap)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} AS t SET attempts = t.attempts + 1,"
            "  next_attempt_at = now()"
            "   + make_interval(secs => (%(delays)s::float8[])[t.attempts + 1]),"
            "  lease_owner = %(token)s,"
            "  lease_expires_at = now()"
            "   + make_interval(secs => LEAST(r.position * %(lease)s, %(cap)s))"
            f"{_touch_sql(model)}"
            f" FROM unnest(%(pks)s::{pk_type}[]) WITH ORDINALITY AS r(pk, position)"
            f" WHERE t.{pk} = r.pk AND t.done_at IS NULL AND NOT t.needs_attention"
            "  AND t.next_attempt_at <= now() AND t.attempts < %(budget)s"
            "  AND NOT (starts_with(t.lease_owner, %(prefix)s) AND t.lease_expires_at > now())"
            f" RETURNING t.{pk}, t.attempts",
            {
                "delays": [policy.backoff(n) for n in range(1, policy.max_attempts + 1)],
                "token": token,
                "lease": lease,
                "cap": cap,
                "pks": ordered,
                "budget": policy.max_attempts,
                "prefix": ATTEMPT_OWNER_PREFIX,
            },
        )
        begun = {row[0]: row[1] for row in cursor.fetchall()}
    return {key: Attempt(number=begun[key], token=token, pk=key) for key in ordered if key in begun}


def attempts_spent(model: type[DueWork], *, pks: Sequence) -> list:
    """Of the rows `pks`, those pending whose budget is spent and no attempt is running."""
    if not pks:
        return []
    return list(
        model.objects.filter(pk__in=list(pks), attempts__gte=model.due_policy().max_attempts)
        .pending()
        .exclude(attempt_running())
        .values_list("pk", flat=True)
    )


def _by_attempt(attempts: Sequence[Attempt]) -> dict[str, list]:
    return {
        "pks": [a.pk for a in attempts],
        "numbers": [a.number for a in attempts],
        "tokens": [a.token for a in attempts],
    }


def _update_held(model: type[DueWork], attempts: Sequence[Attempt], set_sql: str) -> list:
    """One UPDATE of `set_sql` on the rows the `attempts` still hold; their pks."""
    if not attempts:
        return []
    table, pk, pk_type = _table(model)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} AS t SET {set_sql},"
            f"  lease_owner = '', lease_expires_at = NULL{_touch_sql(model)}"
            f" FROM unnest(%(pks)s::{pk_type}[], %(numbers)s::int[], %(tokens)s::text[])"
            "  AS a(pk, number, token)"
            f" WHERE t.{pk} = a.pk AND t.attempts = a.number AND t.lease_owner = a.token"
            f"  AND t.done_at IS NULL RETURNING t.{pk}",
            _by_attempt(attempts),
        )
        return [row[0] for row in cursor.fetchall()]


def attempts_done(model: type[DueWork], *, attempts: Sequence[Attempt]) -> list:
    """Mark done, in one statement, the rows whose `attempts` still hold them; return their pks.

    As `mark_done(attempt=...)` for each: a stale attempt marks nothing.
    """
    return _update_held(model, attempts, "done_at = now(), needs_attention = false")


def attempts_give_back(model: type[DueWork], *, attempts: Sequence[Attempt]) -> list:
    """Undo, in one statement, attempts begun and never made (the ring's time ran out).

    The row's count goes back, its lease is freed and it is due now: the next
    sweep rings it, and no budget was spent on it. A stale attempt changes nothing.
    """
    return _update_held(model, attempts, "attempts = t.attempts - 1, next_attempt_at = now()")
