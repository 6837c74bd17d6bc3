"""The transactional outbox: events written in the same transaction as the change.

Publishing after commit (`on_commit(task.delay)`) loses the event if the
process dies between the commit and the publish; a row written inside the
business transaction cannot be lost that way. The relay (`idempotency.messaging.relay`)
publishes the rows.
"""

from __future__ import annotations

import functools
from typing import Any

from django.db import connection
from django.db.models import Field

from ..models import OutboxMessage


def outbox_write(
    *, aggregate_type: str, aggregate_id: str, event_type: str, payload: dict[str, Any]
) -> OutboxMessage:
    """Stage an event for publication inside the caller's (business) transaction.

    What `OutboxMessage.objects.create` does, with its INSERT written once
    per process (`_insert`): every order's transaction writes one, and the
    ORM compiled it anew each time. The fields with a Python default get it
    (the id, the due columns' defaults), each value prepared by its field
    (`payload` with its encoder); the columns with a database default alone
    (the clocks) come back from the INSERT onto the returned message, as
    the ORM's RETURNING sets them.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("outbox_write must run inside the business transaction")
    message = OutboxMessage(
        aggregate_type=aggregate_type,
        aggregate_id=str(aggregate_id),
        event_type=event_type,
        payload=payload,
    )
    sql, sent, returned = _insert()
    params = [field.get_db_prep_save(getattr(message, field.attname), connection) for field in sent]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    for field, value in zip(returned, row, strict=True):
        setattr(message, field.attname, value)
    message._state.adding = False
    message._state.db = connection.alias
    return message


@functools.cache
def _insert() -> tuple[str, list[Field], list[Field]]:
    """The outbox INSERT: its SQL, the fields it sends, the database-default fields it returns."""
    fields = [f for f in OutboxMessage._meta.concrete_fields if isinstance(f, Field)]
    sent = [f for f in fields if f.has_default() or not f.has_db_default()]
    returned = [f for f in fields if f not in sent]
    assert returned, "the clocks' database defaults are what the INSERT returns"
    quote = connection.ops.quote_name
    sql = (
        f"INSERT INTO {quote(OutboxMessage._meta.db_table)}"  # noqa: S608 - the model's names
        f" ({', '.join(quote(str(f.column)) for f in sent)})"
        f" VALUES ({', '.join(['%s'] * len(sent))})"
        f" RETURNING {', '.join(quote(str(f.column)) for f in returned)}"
    )
    return sql, sent, returned
