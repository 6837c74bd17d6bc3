"""Reads of the idempotency app for other layers (the admin's "Needs attention" list)."""

from __future__ import annotations

from django.db import connection
from django.db.models import QuerySet

from core import attention

from .messaging.deliveries import dead_letters_count
from .models import Delivery, OutboxMessage


def dead_letters() -> QuerySet[Delivery]:
    """Deliveries given up on (dead letters): flagged and not done, until staff requeue them."""
    return Delivery.objects.filter(needs_attention=True, done_at__isnull=True)


def needs_attention_counts() -> dict[str, int]:
    """{kind: rows} for this app's kind of "Needs attention" (dead_letter)."""
    return {attention.DEAD_LETTER: dead_letters_count()}


def needs_attention_items(*, limit: int = attention.PAGE_LIMIT) -> list[attention.AttentionItem]:
    """Dead letters, oldest first; one whose message is about an order names it."""
    items = []
    for delivery in attention.with_age(dead_letters().select_related("message"))[:limit]:
        message = delivery.message
        items.append(
            attention.AttentionItem(
                kind=attention.DEAD_LETTER,
                pk=str(delivery.pk),
                what=f"{message.event_type} to {delivery.consumer} ({delivery.attempts} attempts)",
                reason=delivery.last_error,
                age=delivery.waiting,
                state=attention.row_state(delivery),
                order_id=message.aggregate_id if message.aggregate_type == "order" else None,
            )
        )
    return items


def outbox_backlog() -> tuple[int, float]:
    """Return (rows not yet published, age in seconds of the oldest), by the database clock.

    This is the one place that knows what "not yet published" means: an
    outbox row (a due row) not yet done.
    """
    table = connection.ops.quote_name(OutboxMessage._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0) "
            f"FROM {table} WHERE done_at IS NULL"
        )
        count, age = cursor.fetchone()
    return int(count), max(0.0, float(age))
