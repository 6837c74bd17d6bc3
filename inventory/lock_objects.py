"""Every row lock the inventory app takes, in one place.

Stock rows are always locked in primary-key order, in one statement, so two
transactions that need overlapping stock items queue on the lowest one
instead of each holding one row and waiting for the other's (a deadlock).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection

from .models import StockItem


def stock_items_lock(*, stock_ids: Iterable[int]) -> dict[int, tuple[int, int]]:
    """Lock the given stock rows in primary-key order; return {id: (on_hand, reserved)}.

    The values are the latest committed ones (READ COMMITTED re-reads a row
    that changed while we waited for its lock) and stay true until the
    caller's transaction ends.
    """
    assert connection.in_atomic_block, "a row lock outside a transaction is released at once"
    ids = sorted(set(stock_ids))
    if not ids:
        return {}
    rows = (
        StockItem.objects.filter(id__in=ids)
        .order_by("id")
        .select_for_update(of=("self",))
        .values_list("id", "on_hand", "reserved")
    )
    return {row[0]: (row[1], row[2]) for row in rows}
