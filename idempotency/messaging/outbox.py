"""The transactional outbox: events written in the same transaction as the change.

Publishing after commit (`on_commit(task.delay)`) loses the event if the
process dies between the commit and the publish; a row written inside the
business transaction cannot be lost that way. The relay (`idempotency.messaging.relay`)
publishes the rows.
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from ..models import OutboxMessage


def outbox_write(
    *, aggregate_type: str, aggregate_id: str, event_type: str, payload: dict[str, Any]
) -> OutboxMessage:
    """Stage an event for publication inside the caller's (business) transaction."""
    if not connection.in_atomic_block:
        raise RuntimeError("outbox_write must run inside the business transaction")
    return OutboxMessage.objects.create(
        aggregate_type=aggregate_type,
        aggregate_id=str(aggregate_id),
        event_type=event_type,
        payload=payload,
    )
