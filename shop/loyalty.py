"""Loyalty points: each event applied once by optimistic concurrency, without the inbox.

The account row carries the ids of the events it has applied. A change is
one `UPDATE ... WHERE user_id = %s AND version = <version read>` that moves
the balance, bumps the version, appends the event id and drops the ids
older than `LOYALTY_APPLIED_IDS_RETENTION` (database clock), all at once:
the balance and the record of what made it cannot drift apart. An id
already in the list is a duplicate; a row count of 0 means someone else
changed the account since it was read, so read again and retry.

The order's tally (`LoyaltyOrder`: earned, reversed, cancelled) is written
in the same transaction, after the versioned UPDATE succeeded: every writer
of a tally first wins that UPDATE, so the account's version guards the
tally as well (a tally read before a concurrent change is caught by the
version having moved). See docs/events.md.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction

from idempotency import metrics
from idempotency.messaging.deliveries import Message

from . import events
from .events import Outcome
from .models import LoyaltyAccount

MAX_TRIES = 20


@dataclass(frozen=True)
class LoyaltyResult:
    outcome: Outcome
    points: int = 0  # the change to the balance (negative for a reversal)
    balance: int | None = None
    version: int | None = None


class LoyaltyConflict(events.RetryableConsumerError):
    """Raise when the account kept changing under every try: retry the message later."""


def _duplicate_suppressed() -> None:
    # The one place a loyalty duplicate is counted.
    metrics.duplicate_suppressed(mechanism=metrics.PROCESSED_ID, consumer="loyalty")


def _ensure_account(user_id: int) -> None:
    """Create the account if it is missing: insert first, the primary key decides."""
    users = connection.ops.quote_name(get_user_model()._meta.db_table)
    with connection.cursor() as cursor:
        # An owner that is not a user inserts nothing (the FK is checked only
        # at commit; this refuses at once) and `_read` then finds no account.
        cursor.execute(
            "INSERT INTO shop_loyaltyaccount "
            "(user_id, balance, version, applied, created_at, updated_at) "
            f"SELECT id, 0, 0, '[]'::jsonb, now(), now() FROM {users} WHERE id = %s "
            "ON CONFLICT (user_id) DO NOTHING",
            [user_id],
        )


def _read(user_id: int, event_id: str) -> tuple[int, int, bool]:
    """Return (balance, version, already applied) of the account; poison if it has none."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT balance, version, "
            "applied @> jsonb_build_array(jsonb_build_object('id', %s::text)) "
            "FROM shop_loyaltyaccount WHERE user_id = %s",
            [event_id, user_id],
        )
        row = cursor.fetchone()
    if row is None:
        raise events.PoisonMessage(f"owner {user_id} is not a user of this shop")
    return row


def _tally(user_id: int, order_id: str) -> tuple[int, int, str | None, bool]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT earned, reversed, earned_by, cancelled FROM shop_loyaltyorder "
            "WHERE account_id = %s AND order_id = %s",
            [user_id, order_id],
        )
        return cursor.fetchone() or (0, 0, None, False)


def _change(
    fact: events.OrderFact, event_id: str, tally: tuple[int, int, str | None, bool]
) -> tuple[int, tuple[int, int, str | None, bool]]:
    """Return (points to add, the order's new tally) for this event, by the contract's rules."""
    earned, reversed_, earned_by, cancelled = tally
    if fact.event_type in events.CONFIRMED_TYPES:
        if earned_by is not None or cancelled:
            # Already earned (by another event id), or cancelled before this
            # confirmation arrived (out of order): a cancelled order keeps nothing.
            return 0, tally
        points = sum(line.points for line in fact.lines)
        return points, (points, reversed_, event_id, cancelled)
    if fact.event_type == events.RETURN_COMPLETED:
        # Not capped at what is left: a return delivered before its order's
        # confirmation still nets to the right balance once both are applied.
        points = sum(line.points for line in fact.lines)
        return -points, (earned, reversed_ + points, earned_by, cancelled)
    assert fact.event_type == events.ORDER_CANCELLED, fact.event_type
    if cancelled:
        return 0, tally
    left = max(earned - reversed_, 0)
    return -left, (earned, reversed_ + left, earned_by, True)


def _update(*, user_id: int, version: int, points: int, event_id: str) -> int | None:
    """Apply the change if the account is still at `version`; return the new version or None."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE shop_loyaltyaccount SET "
            "balance = balance + %(points)s, "
            "version = version + 1, "
            "applied = COALESCE("
            "  (SELECT jsonb_agg(entry ORDER BY ordinality) "
            "   FROM jsonb_array_elements(applied) WITH ORDINALITY AS a(entry, ordinality) "
            "   WHERE (entry->>'at')::timestamptz "
            "         > now() - make_interval(secs => %(retention)s)), "
            "  '[]'::jsonb"
            ") || jsonb_build_array(jsonb_build_object('id', %(event_id)s::text, 'at', now())), "
            "updated_at = now() "
            "WHERE user_id = %(user_id)s AND version = %(version)s "
            "RETURNING version",
            {
                "points": points,
                "retention": float(settings.LOYALTY_APPLIED_IDS_RETENTION),
                "event_id": event_id,
                "user_id": user_id,
                "version": version,
            },
        )
        row = cursor.fetchone()
    return None if row is None else row[0]


def _write_tally(user_id: int, order_id: str, tally: tuple[int, int, str | None, bool]) -> None:
    earned, reversed_, earned_by, cancelled = tally
    with connection.cursor() as cursor:
        # The account's row lock (taken by the UPDATE just made) serialises
        # every writer of this tally, so plain values are safe here.
        cursor.execute(
            "INSERT INTO shop_loyaltyorder (account_id, order_id, earned, reversed, earned_by, "
            "cancelled) VALUES (%s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (account_id, order_id) DO UPDATE SET earned = EXCLUDED.earned, "
            "reversed = EXCLUDED.reversed, earned_by = EXCLUDED.earned_by, "
            "cancelled = EXCLUDED.cancelled",
            [user_id, order_id, earned, reversed_, earned_by, cancelled],
        )


def _try(fact: events.OrderFact, event_id: str) -> LoyaltyResult | None:
    """Make one attempt in one transaction; None when the version moved under it."""
    with transaction.atomic():
        return _try_here(fact, event_id)


def _try_here(fact: events.OrderFact, event_id: str) -> LoyaltyResult | None:
    """One attempt in the transaction already open; None (nothing written) if the version moved.

    A try that returns None wrote nothing (reads and an UPDATE that matched no
    row), so it needs no savepoint of its own to be tried again.
    """
    balance, version, seen = _read(fact.owner_id, event_id)
    if seen:
        return LoyaltyResult(Outcome.DUPLICATE, balance=balance, version=version)
    tally = _tally(fact.owner_id, fact.order_id)
    points, new_tally = _change(fact, event_id, tally)
    new_version = _update(user_id=fact.owner_id, version=version, points=points, event_id=event_id)
    if new_version is None:
        return None
    if new_tally != tally:
        _write_tally(fact.owner_id, fact.order_id, new_tally)
    return LoyaltyResult(
        Outcome.APPLIED, points=points, balance=balance + points, version=new_version
    )


def _check_id(event_id: object) -> None:
    if not isinstance(event_id, str) or not event_id or len(event_id) > 255:
        raise events.PoisonMessage(f"event id must be a non-empty string: {event_id!r}")


def _apply_fact(
    fact: events.OrderFact, event_id: str, attempt_once, *, ensure: bool = True
) -> LoyaltyResult:
    if ensure:
        _ensure_account(fact.owner_id)
    for attempt in range(MAX_TRIES):
        result = attempt_once(fact, event_id)
        if result is not None:
            if result.outcome == Outcome.DUPLICATE:
                _duplicate_suppressed()
            return result
        # Lost the race: back off a little, jittered, so the winners spread out.
        time.sleep(random.uniform(0, 0.005 * (attempt + 1)))
    raise LoyaltyConflict(
        f"the points of user {fact.owner_id} changed under {MAX_TRIES} tries of event {event_id}"
    )


def loyalty_apply(*, event_id: str, event_type: str, payload: dict) -> LoyaltyResult:
    """Apply one order or return event to its shopper's points, at most once per event id.

    Call it outside a transaction (each try is its own). Return `applied`,
    `duplicate` (the id is among the applied ones; counted) or `ignored` (a
    type points do not depend on). Raise `PoisonMessage` for a payload that
    cannot be read, `LoyaltyConflict` (retryable) when `MAX_TRIES` tries all
    lost the race for the account.
    """
    _check_id(event_id)
    fact = events.parse(event_type=event_type, payload=payload)
    if fact is None:
        return LoyaltyResult(Outcome.IGNORED)
    return _apply_fact(fact, event_id, _try)


# The batch's accounts, locked in owner order, with which of the batch's ids each has applied.
_LOCK_ACCOUNTS = (
    "SELECT user_id, balance, version, ARRAY(SELECT entry->>'id'"
    "  FROM jsonb_array_elements(applied) AS a(entry) WHERE entry->>'id' = ANY(%(ids)s::text[]))"
    " FROM shop_loyaltyaccount WHERE user_id = ANY(%(owners)s::bigint[])"
    " ORDER BY user_id FOR UPDATE"
)
_READ_TALLIES = (
    "SELECT t.account_id, t.order_id, t.earned, t.reversed, t.earned_by, t.cancelled"
    " FROM shop_loyaltyorder t JOIN unnest(%s::bigint[], %s::text[]) AS k(account_id, order_id)"
    " ON t.account_id = k.account_id AND t.order_id = k.order_id"
)
# Every account of the batch in one versioned UPDATE: its events' points, one version per
# event, their ids appended (each `at` the database's now()) to the entries the retention
# keeps. Row count short of the accounts: a version moved (it cannot, under the lock).
_UPDATE_ACCOUNTS = (
    "UPDATE shop_loyaltyaccount AS a SET balance = a.balance + u.points,"
    " version = a.version + u.n,"
    " applied = COALESCE("
    "  (SELECT jsonb_agg(entry ORDER BY ordinality)"
    "   FROM jsonb_array_elements(a.applied) WITH ORDINALITY AS x(entry, ordinality)"
    "   WHERE (entry->>'at')::timestamptz > now() - make_interval(secs => %(retention)s)),"
    "  '[]'::jsonb)"
    " || (SELECT jsonb_agg(jsonb_build_object('id', i.id, 'at', now()) ORDER BY i.ordinality)"
    "     FROM unnest(u.ids) WITH ORDINALITY AS i(id, ordinality)),"
    " updated_at = now()"
    " FROM (SELECT * FROM unnest(%(owners)s::bigint[], %(versions)s::bigint[],"
    "  %(points)s::bigint[], %(counts)s::bigint[]) AS v(user_id, version, points, n)"
    "  JOIN LATERAL (SELECT array_agg(e.id ORDER BY e.k) AS ids"
    "   FROM unnest(%(event_owners)s::bigint[], %(event_ids)s::text[])"
    "   WITH ORDINALITY AS e(owner, id, k) WHERE e.owner = v.user_id) AS l"
    "  ON true) AS u"
    " WHERE a.user_id = u.user_id AND a.version = u.version RETURNING a.user_id"
)
_WRITE_TALLIES = (
    "INSERT INTO shop_loyaltyorder (account_id, order_id, earned, reversed, earned_by, cancelled)"
    " SELECT * FROM unnest(%s::bigint[], %s::text[], %s::bigint[], %s::bigint[], %s::text[],"
    "  %s::boolean[])"
    " ON CONFLICT (account_id, order_id) DO UPDATE SET earned = EXCLUDED.earned,"
    " reversed = EXCLUDED.reversed, earned_by = EXCLUDED.earned_by,"
    " cancelled = EXCLUDED.cancelled"
)


@dataclass
class _Account:
    balance: int
    version: int
    read_version: int
    seen: set[str]
    points: int = 0
    ids: list[str] = field(default_factory=list)


def loyalty_apply_many(messages: Sequence[Message]) -> list[LoyaltyResult]:
    """Apply a batch of events in the caller's transaction: `loyalty_apply` for many at once.

    Every message is parsed first (a poison message raises before anything is
    written, and the caller applies the batch one by one). The batch costs the
    same statements whatever its size: the accounts are made insert first and
    locked in owner order with the batch's ids they have applied (no deadlock
    between two batches, no lost race), the orders' tallies read, the events
    applied in Python by owner in the batch's order (each its own version,
    as one by one), then one versioned UPDATE of every account and one upsert
    of the tallies that changed (docs/events.md, "Batched consumers").
    """
    if not connection.in_atomic_block:
        raise RuntimeError("loyalty_apply_many must run inside the batch's transaction")
    facts: list[events.OrderFact | None] = []
    for message in messages:
        _check_id(message.message_id)
        facts.append(events.parse(event_type=message.event_type, payload=message.payload))
    results: list[LoyaltyResult] = [LoyaltyResult(Outcome.IGNORED)] * len(messages)
    todo = sorted(
        ((fact.owner_id, index, fact) for index, fact in enumerate(facts) if fact is not None),
        key=lambda item: (item[0], item[1]),
    )
    if not todo:
        return results
    owners = sorted({owner for owner, _, _ in todo})
    accounts = _accounts_locked(owners, [messages[index].message_id for _, index, _ in todo])
    tallies = _tallies_read(sorted({(owner, fact.order_id) for owner, _, fact in todo}))
    changed: dict[tuple[int, str], tuple[int, int, str | None, bool]] = {}
    for owner, index, fact in todo:
        account = accounts[owner]
        event_id = messages[index].message_id
        if event_id in account.seen:
            _duplicate_suppressed()
            results[index] = LoyaltyResult(
                Outcome.DUPLICATE, balance=account.balance, version=account.version
            )
            continue
        key = (owner, fact.order_id)
        tally = tallies.get(key, (0, 0, None, False))
        points, new_tally = _change(fact, event_id, tally)
        if new_tally != tally:
            tallies[key] = changed[key] = new_tally
        account.seen.add(event_id)
        account.ids.append(event_id)
        account.points += points
        account.balance += points
        account.version += 1
        results[index] = LoyaltyResult(
            Outcome.APPLIED, points=points, balance=account.balance, version=account.version
        )
    _accounts_write(accounts)
    _tallies_write(changed)
    return results


def _accounts_locked(owners: list[int], event_ids: list[str]) -> dict[int, _Account]:
    """Make the accounts insert first, lock them in owner order; poison if an owner has none."""
    users = connection.ops.quote_name(get_user_model()._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO shop_loyaltyaccount "
            "(user_id, balance, version, applied, created_at, updated_at) "
            f"SELECT id, 0, 0, '[]'::jsonb, now(), now() FROM {users}"
            " WHERE id = ANY(%s::bigint[]) ORDER BY id ON CONFLICT (user_id) DO NOTHING",
            [owners],
        )
        cursor.execute(_LOCK_ACCOUNTS, {"owners": owners, "ids": event_ids})
        accounts = {
            user_id: _Account(
                balance=balance, version=version, read_version=version, seen=set(seen)
            )
            for user_id, balance, version, seen in cursor.fetchall()
        }
    for owner in owners:
        if owner not in accounts:
            raise events.PoisonMessage(f"owner {owner} is not a user of this shop")
    return accounts


def _tallies_read(keys: list[tuple[int, str]]) -> dict[tuple[int, str], tuple]:
    with connection.cursor() as cursor:
        cursor.execute(_READ_TALLIES, [[k[0] for k in keys], [k[1] for k in keys]])
        return {(row[0], row[1]): tuple(row[2:]) for row in cursor.fetchall()}


def _accounts_write(accounts: dict[int, _Account]) -> None:
    moved = {owner: account for owner, account in accounts.items() if account.ids}
    if not moved:
        return
    owners = sorted(moved)
    event_owners = [owner for owner in owners for _ in moved[owner].ids]
    with connection.cursor() as cursor:
        cursor.execute(
            _UPDATE_ACCOUNTS,
            {
                "retention": float(settings.LOYALTY_APPLIED_IDS_RETENTION),
                "owners": owners,
                "versions": [moved[owner].read_version for owner in owners],
                "points": [moved[owner].points for owner in owners],
                "counts": [len(moved[owner].ids) for owner in owners],
                "event_owners": event_owners,
                "event_ids": [event_id for owner in owners for event_id in moved[owner].ids],
            },
        )
        if cursor.rowcount != len(owners):
            # Under the batch's lock no version moves; were one to, nothing may stand.
            raise LoyaltyConflict(f"the points of users {owners} moved under the batch's lock")


def _tallies_write(changed: dict[tuple[int, str], tuple[int, int, str | None, bool]]) -> None:
    if not changed:
        return
    keys = sorted(changed)
    columns = list(zip(*(changed[key] for key in keys), strict=True))
    with connection.cursor() as cursor:
        cursor.execute(
            _WRITE_TALLIES,
            [[k[0] for k in keys], [k[1] for k in keys], *[list(column) for column in columns]],
        )


def loyalty_get(*, user) -> tuple[int, int]:
    """Return (balance, version) of the shopper's points; (0, 0) before their first event."""
    row = LoyaltyAccount.objects.filter(user_id=user.pk).values_list("balance", "version").first()
    return row or (0, 0)
