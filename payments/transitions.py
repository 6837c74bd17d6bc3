"""The payment's one conditional status transition (and the quoted table names of the SQL).

`payment_transition` is how every writer moves a payment's status: the
capture's first step (`none` → `pending`), the capture recorder and the
refund transition (`payments.recording`). It changes the row only if it is
still in the status that was read, so whoever moves it first wins and every
later writer changes nothing. `sql_table` quotes a model's table for the raw
SQL of the payments modules.
"""

from __future__ import annotations

import json
from decimal import Decimal

from django.db import connection

from core import rows

from .errors import InvalidPaymentTransition
from .models import PAYMENT_TRANSITIONS, Payment, PaymentEvent


def sql_table(model) -> str:
    """The model's table name, quoted for raw SQL."""
    return connection.ops.quote_name(model._meta.db_table)


def payment_transition(
    *,
    payment: Payment,
    to: str,
    detail: dict,
    increments: dict[str, Decimal] | None = None,
    also: tuple[str, list] | None = None,
) -> Payment | None:
    """Move a payment to `to` if it is still in the status we read; write the event.

    One statement: the conditional UPDATE (amount columns grow by
    `increments`, in SQL) and the event INSERT fed by its RETURNING, so the
    event exists exactly when the change happened. `also` is (SQL, params)
    of further common table expressions that write only when `moved` holds a
    row (each reads it), in the same statement. Return the payment as
    updated, or None when another transaction moved it first (nothing written).
    """
    if to not in PAYMENT_TRANSITIONS[payment.status]:
        raise InvalidPaymentTransition(f"A payment cannot go from {payment.status} to {to}.")
    sets = ["status = %s", "updated_at = statement_timestamp()"]
    params: list = [to]
    for column, amount in (increments or {}).items():
        Payment._meta.get_field(column)  # only real columns reach the SQL
        sets.append(f"{column} = {column} + %s")
        params.append(amount)
    sql = (
        f"WITH moved AS (UPDATE {sql_table(Payment)} SET {', '.join(sets)}"
        "  WHERE id = %s AND status = %s RETURNING *),"
        f" event AS (INSERT INTO {sql_table(PaymentEvent)}"
        "  (payment_id, kind, from_status, to_status, detail)"
        "  SELECT id, 'transition', %s, %s, %s::jsonb FROM moved)"
        f"{', ' + also[0] if also else ''}"
        " SELECT * FROM moved"
    )
    params += [payment.id, payment.status, payment.status, to, json.dumps(detail)]
    if also:
        params += also[1]
    moved = rows.raw(Payment, sql, params)
    return moved[0] if moved else None
