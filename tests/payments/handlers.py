"""A settled-outcome handler for tests: records each call and what it saw."""

from django.db import connection

calls: list[dict] = []


def record(*, payment, outcome: str) -> None:
    from payments.models import Payment

    calls.append(
        {
            "reference": payment.reference,
            "outcome": outcome,
            "status": payment.status,
            "in_transaction": connection.in_atomic_block,
            # What the same transaction sees: the outcome is already recorded.
            "status_in_db": Payment.objects.get(id=payment.id).status,
        }
    )
