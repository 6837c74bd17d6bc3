"""The inbox: a consumer records a message id first, in the transaction of its effect.

The unique (consumer, message_id) constraint decides: the insert runs in a
savepoint inside the consumer's transaction, so a duplicate leaves that
transaction usable and the consumer simply skips its effect. A concurrent
duplicate waits on the first one's uncommitted row and then sees it (the
pessimistic order: the dedup record before the effect).

`inbox_claim_many` records a batch's ids in one statement (`ON CONFLICT ON
CONSTRAINT ... DO NOTHING`: the same constraint decides, with no savepoint
per id), for the batched consumers (docs/events.md, "Batched consumers").

`inbox_purge` deletes rows past IDEMPOTENCY_INBOX_RETENTION (beat's `idempotency.purge_inbox`;
docs/operations.md, "Retention").
"""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import QuerySet
from django.db.models.functions import Now

from core.db import delete_in_batches, violated_constraint

from .. import metrics
from ..models import InboxMessage

INBOX_CONSTRAINT = "idempotency_inboxmessage_consumer_message_uniq"


def inbox_claim(*, consumer: str, message_id: str) -> bool:
    """Record `message_id` for `consumer`; return False if it was already processed."""
    if not connection.in_atomic_block:
        raise RuntimeError("inbox_claim must run inside the consumer's transaction")
    try:
        with transaction.atomic():
            InboxMessage.objects.create(consumer=consumer, message_id=message_id)
    except IntegrityError as exc:
        if violated_constraint(exc) != INBOX_CONSTRAINT:
            raise
        metrics.duplicate_suppressed(
            mechanism=metrics.INBOX_DUPLICATE, consumer=consumer, message_id=message_id
        )
        return False
    return True


_CLAIM_MANY = (
    f"INSERT INTO {InboxMessage._meta.db_table} (consumer, message_id)"
    " SELECT %s, m FROM unnest(%s::text[]) AS u(m) ORDER BY m"
    f" ON CONFLICT ON CONSTRAINT {INBOX_CONSTRAINT} DO NOTHING RETURNING message_id"
)


def inbox_claim_many(*, consumer: str, message_ids: Iterable[str]) -> set[str]:
    """Record every id for `consumer` in one statement; return the ids recorded now.

    An id not returned was processed already (or is being, by a transaction
    this one waited for): its duplicate is counted like `inbox_claim`'s. The
    ids are inserted in sorted order, so two batches sharing ids wait for each
    other instead of deadlocking.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("inbox_claim_many must run inside the consumer's transaction")
    wanted = sorted(set(message_ids))
    if not wanted:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_MANY, [consumer, wanted])
        claimed = {row[0] for row in cursor.fetchall()}
    for message_id in wanted:
        if message_id not in claimed:
            metrics.duplicate_suppressed(
                mechanism=metrics.INBOX_DUPLICATE, consumer=consumer, message_id=message_id
            )
    return claimed


def inbox_purge(*, batch: int | None = None, max_batches: int | None = None) -> int:
    """Delete inbox rows received more than IDEMPOTENCY_INBOX_RETENTION ago; return how many.

    The retention outlives every copy a row must refuse (settings: at least the
    outbox's retention plus the redelivery window, and a session's age for a
    guest cart's id). A provider event stored `unmatched` is kept: it is the
    answer a settlement or a refund may still meet. Bounded batches in id order
    (the primary key's index; ids grow with `received_at`), each its own short
    transaction, skipping rows a consumer or another purge holds.
    """
    batch = batch or settings.IDEMPOTENCY_INBOX_PURGE_BATCH
    max_batches = max_batches or settings.IDEMPOTENCY_INBOX_PURGE_MAX_BATCHES
    table = InboxMessage._meta.db_table
    return delete_in_batches(
        f"WITH old AS (SELECT id FROM {table}"
        " WHERE received_at < now() - make_interval(secs => %s) AND status <> 'unmatched'"
        " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)"
        f" DELETE FROM {table} i USING old WHERE i.id = old.id",
        [float(settings.IDEMPOTENCY_INBOX_RETENTION)],
        batch=batch,
        max_batches=max_batches,
    )


# --- A source's stored messages (the provider's webhooks): kept whole, with what
# became of each (status, detail), for a recorder to meet later.


def inbox_store(
    *, consumer: str, message_id: str, message_type: str, payload: dict, status: str
) -> InboxMessage:
    """Insert one received message whole; its (consumer, message_id) constraint decides a
    duplicate (IntegrityError on INBOX_CONSTRAINT, for the caller to treat)."""
    return InboxMessage.objects.create(
        consumer=consumer,
        message_id=message_id,
        message_type=message_type,
        payload=payload,
        status=status,
    )


def inbox_mark(*, row_id, status: str, detail: str, processed: bool | None = None) -> None:
    """Record what became of a stored message; `processed` (when given) sets or clears
    its processed time (now, by the database clock)."""
    values: dict = {"status": status, "detail": detail}
    if processed is not None:
        values["processed_at"] = Now() if processed else None
    InboxMessage.objects.filter(id=row_id).update(**values)


def inbox_payload(*, consumer: str, message_id: str) -> dict | None:
    """The payload stored under a message id, or None."""
    return (
        InboxMessage.objects.filter(consumer=consumer, message_id=message_id)
        .values_list("payload", flat=True)
        .first()
    )


def inbox_locked(
    *, consumer: str, status: str, message_types, payload_lookup: dict
) -> QuerySet[InboxMessage]:
    """Stored messages of `consumer` in `status`, of `message_types`, matching
    `payload_lookup` (lookups under `payload__`), oldest first, locked as read."""
    return (
        InboxMessage.objects.select_for_update()
        .filter(
            consumer=consumer,
            status=status,
            message_type__in=message_types,
            **{f"payload__{key}": value for key, value in payload_lookup.items()},
        )
        .order_by("received_at", "id")
    )
