"""The inbox: a consumer records a message id first, in the transaction of its effect.

The unique (consumer, message_id) constraint decides: the insert runs in a
savepoint inside the consumer's transaction, so a duplicate leaves that
transaction usable and the consumer simply skips its effect. A concurrent
duplicate waits on the first one's uncommitted row and then sees it (the
pessimistic order: the dedup record before the effect).
"""

from __future__ import annotations

from django.db import IntegrityError, connection, transaction

from core.db import violated_constraint

from . import metrics
from .models import InboxMessage

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
