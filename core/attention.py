"""An item waiting for a person: the shape every app's "Needs attention" selector returns.

Each app lists its own rows (payments: settlements past their budget and
refunds in `needs_attention`; orders: compensation steps that failed;
idempotency: dead letters; reports: days that could not be made); the
admin's "Needs attention" page and the `shop_needs_attention{kind}` gauge
(config) put them together. An app names
what a row belongs to by ids only (`payment_id`, `order_id`, `return_id`,
`refund_id`): the page, which may import every app, turns them into order
numbers and returns.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from django.db.models import DurationField, ExpressionWrapper, F, QuerySet
from django.db.models.functions import Now

SETTLEMENT = "settlement"
REFUND = "refund"
STEP = "step"
DEAD_LETTER = "dead_letter"
REPORT_DAY = "report_day"
# The gauge's `kind` label values and the page's sections, in this order.
KINDS = (SETTLEMENT, REFUND, STEP, DEAD_LETTER, REPORT_DAY)

# How many rows of one kind the page lists (the count is always exact).
PAGE_LIMIT = 200

# Row columns that move whenever a due row changes (attempt, flag, decision):
# an action form's key is derived from them, so two tabs showing the same
# state carry one key and a changed row gets a new one.
STATE_FIELDS = ("attempts", "needs_attention", "done_at", "status", "updated_at")


@dataclass(frozen=True)
class AttentionItem:
    kind: str  # one of KINDS
    pk: str  # the row's primary key, as text
    what: str  # the row, for people ("refund 15.50 EUR (return)")
    reason: str  # why it stopped (`last_error`)
    age: datetime.timedelta  # since the row last changed (when it was flagged), database clock
    state: str  # the row's state as listed (see STATE_FIELDS)
    status: str = ""  # the row's status where it has one (which actions apply)
    payment_id: Any = None
    order_id: Any = None
    return_id: Any = None
    refund_id: Any = None


def with_age(queryset: QuerySet) -> QuerySet:
    """Annotate `waiting`: now() − updated_at, by the database clock, oldest first."""
    age = ExpressionWrapper(Now() - F("updated_at"), output_field=DurationField())
    return queryset.annotate(waiting=age).order_by("updated_at")


def row_state(row) -> str:
    """The row's state as text (STATE_FIELDS it has), for an action form's key."""
    return ":".join(str(getattr(row, name, "")) for name in STATE_FIELDS)
