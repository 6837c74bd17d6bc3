"""Limits per shopper on new orders: a rate, and a cap on orders holding stock.

docs/checkout.md, "Limits per shopper". A shopper places at most
`ORDER_PLACE_PER_MINUTE` orders in any minute and holds at most
`ORDER_HOLDING_MAX` orders awaiting a decision or a payment outcome
(`HOLDING_STATUSES`); past either, a new order is refused with 429
`throttled` and `Retry-After`, and nothing is held.

`orders.services.order_hold` calls `order_limits_check` first, inside the
transaction that holds the flags and inserts the order:

- The owner's user row is locked first (`lock_objects.order_owner_lock`),
  then the owner's orders are read in a statement of their own (under READ
  COMMITTED it sees what committed while it waited): two placements of one
  shopper at the cap minus one queue on that lock, and the second counts the
  first one's order. A count without the lock lets both through.
- A refusal raises before any flag is held. Raised in the request key's
  first phase, a 429 is not stored (`idempotency.keys.UNSTORED_STATUSES`): the
  key is forgotten and the same request may be sent again once the limit
  allows it.
- Only a new order is counted: a replay of a finished key is answered from
  its stored answer and a retry of an open key resumes past `order_hold`, so
  neither is ever throttled. Confirming or cancelling an `awaiting_decision`
  order is not a new order either.
- The refusal's detail is in the active language, its counts in their plural
  form: the checkout page reads it in the shopper's language, the API in
  English (docs/storefront.md, "Languages").
- Time is the database's (`core.db.STATEMENT_CLOCK_SQL` against `created_at` and
  `reservation_expires_at`, both written by the database clock), never a host's.

Every user placing orders is counted, staff included: an order holds stock
whoever placed it.
"""

from __future__ import annotations

import functools
import math
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from core.db import STATEMENT_CLOCK_SQL
from core.errors import ApplicationError

from . import lock_objects
from .models import Order
from .states import HOLDING_STATUSES

# The rate's window, in seconds (ORDER_PLACE_PER_MINUTE).
RATE_PERIOD = 60
# Retry-After when every held order waits for a payment outcome (no expiry to name):
# settlement learns most outcomes within a minute (docs/payments.md).
HOLDING_RETRY_AFTER = 60


class OrderThrottled(ApplicationError):
    status = 429
    code = "throttled"
    title = "Throttled"


@functools.cache
def owner_orders_sql() -> str:
    """The limits' one read (`_owner_orders`), its values named parameters; written once
    per process, as the checkout's other statements (core/rows.py)."""
    table = connection.ops.quote_name(Order._meta.db_table)
    # The statuses are written into the statement, not bound: a prepared statement's
    # generic plan can then use the partial orders_order_owner_holding_idx, whose
    # condition names them, and PostgreSQL need not plan the read on every call.
    assert all(status.isidentifier() for status in HOLDING_STATUSES)
    holding = ", ".join(f"'{status}'" for status in sorted(HOLDING_STATUSES))
    return f"""
        WITH recent AS (
            SELECT created_at FROM {table}
             WHERE owner_id = %(owner)s
               AND created_at > {STATEMENT_CLOCK_SQL} - make_interval(secs => %(period)s)
             ORDER BY created_at DESC LIMIT %(rate)s
        )
        SELECT {STATEMENT_CLOCK_SQL},
               (SELECT count(*) FROM recent),
               (SELECT min(created_at) FROM recent),
               ARRAY(SELECT reservation_expires_at FROM {table}
                     WHERE owner_id = %(owner)s AND status IN ({holding})
                     ORDER BY reservation_expires_at ASC NULLS LAST LIMIT %(most)s)
        """  # noqa: S608 - the table name is the model's, quoted; values are parameters


def _owner_orders(
    *, owner_id, rate: int, holding_max: int
) -> tuple[datetime, int, datetime | None, list]:
    """Read the database clock, how many of the owner's orders the last RATE_PERIOD holds
    (at most `rate`) and the oldest of those, and the expiry of up to `holding_max` of
    their orders holding stock (earliest first).

    One statement, the database clock included (`core.db.STATEMENT_CLOCK_SQL`,
    no read of its own). The window is read through `orders_order_owner_created_idx`
    and stops at the window's start or at `rate` orders, whichever comes first;
    the holding orders through the partial `orders_order_owner_holding_idx`. Neither
    reads the owner's history, however long, nor returns more than two values
    for the window, whatever the limits are set to.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            owner_orders_sql(),
            {
                "owner": owner_id,
                "period": float(RATE_PERIOD),
                "rate": rate,
                "most": holding_max,
            },
        )
        now, placed, oldest, holding = cursor.fetchone()
    return now, placed, oldest, holding


def _seconds(delta) -> int:
    return max(1, math.ceil(delta.total_seconds()))


def order_limits_check(*, owner_id) -> None:
    """Lock the owner's row and refuse a new order past either limit (OrderThrottled, 429).

    Must run inside the transaction that inserts the order (`order_hold`).
    """
    rate = max(1, int(settings.ORDER_PLACE_PER_MINUTE))
    holding_max = max(1, int(settings.ORDER_HOLDING_MAX))
    lock_objects.order_owner_lock(owner_id=owner_id)
    now, in_window, oldest, holding = _owner_orders(
        owner_id=owner_id, rate=rate, holding_max=holding_max
    )
    waits: dict[str, int] = {}
    if in_window >= rate and oldest is not None:
        # The oldest of them leaves the window first.
        leaves = oldest + timedelta(seconds=RATE_PERIOD)
        waits["rate"] = min(RATE_PERIOD, _seconds(leaves - now))
    if len(holding) >= holding_max:
        expiries = [at for at in holding if at is not None]
        waits["holding"] = _seconds(min(expiries) - now) if expiries else HOLDING_RETRY_AFTER
    if not waits:
        return
    wait = max(waits.values())
    # Both lists stop at their limit, so a refusal counts exactly the limit it names.
    if "holding" in waits:
        detail = ngettext(
            "You have {count} order awaiting your decision or a payment outcome "
            "(at most {most}): decide on it, or wait until it ends, before placing another.",
            "You have {count} orders awaiting your decision or a payment outcome "
            "(at most {most}): decide on one, or wait until one ends, before placing another.",
            len(holding),
        ).format(count=len(holding), most=holding_max)
    else:
        orders = ngettext(
            "You placed {count} order in the last minute (at most {most})",
            "You placed {count} orders in the last minute (at most {most})",
            in_window,
        ).format(count=in_window, most=rate)
        then = ngettext(
            "wait {seconds} second before placing another.",
            "wait {seconds} seconds before placing another.",
            wait,
        ).format(seconds=wait)
        # Translators: the rate refusal's two halves: the orders placed, then the wait.
        detail = _("{orders}: {then}").format(orders=orders, then=then)
    nothing = _("Nothing was held or charged for this order.")
    raise OrderThrottled(
        f"{detail} {nothing}",
        extra={"limit": "holding" if "holding" in waits else "rate"},
        headers={"Retry-After": str(wait)},
    )
