"""The outbox row is written inside the business transaction, or not at all."""

import uuid
from decimal import Decimal

import pytest
from django.db import transaction

from idempotency.messaging.outbox import outbox_write
from idempotency.models import OutboxMessage
from tests.support.compiles import orm_compiles

pytestmark = pytest.mark.django_db(transaction=True)


def test_outbox_write_outside_a_transaction_is_refused():
    with pytest.raises(RuntimeError):
        outbox_write(aggregate_type="order", aggregate_id="1", event_type="x", payload={})
    assert not OutboxMessage.objects.exists()


def test_outbox_row_commits_and_rolls_back_with_the_business_change():
    with transaction.atomic():
        message = outbox_write(
            aggregate_type="order",
            aggregate_id=uuid.UUID(int=7),
            event_type="order.confirmed",
            payload={"total": Decimal("19.99"), "id": uuid.UUID(int=7)},
        )
    row = OutboxMessage.objects.get()
    assert row.id == message.id and isinstance(row.id, uuid.UUID)
    assert row.aggregate_id == str(uuid.UUID(int=7))
    assert row.payload == {"total": "19.99", "id": str(uuid.UUID(int=7))}
    assert row.published_at is None and row.attempts == 0
    assert row.created_at is not None and row.next_attempt_at is not None

    with pytest.raises(ZeroDivisionError), transaction.atomic():
        outbox_write(aggregate_type="order", aggregate_id="2", event_type="x", payload={})
        1 / 0  # noqa: B018 - the business change fails after the event was staged
    assert OutboxMessage.objects.count() == 1


def test_outbox_write_is_the_orms_create_without_its_compile():
    with transaction.atomic():
        outbox_write(aggregate_type="order", aggregate_id="0", event_type="x", payload={})
        with orm_compiles() as compiles:
            message = outbox_write(
                aggregate_type="order",
                aggregate_id="1",
                event_type="order.confirmed",
                payload={"total": Decimal("1.50")},
            )
    assert compiles == []
    row = OutboxMessage.objects.get(id=message.id)
    assert message._state.adding is False and message._state.db == row._state.db
    for field in OutboxMessage._meta.concrete_fields:
        if field.name != "payload":
            assert getattr(message, field.attname) == getattr(row, field.attname), field.name
    assert message.payload == {"total": Decimal("1.50")} and row.payload == {"total": "1.50"}
