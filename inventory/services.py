"""Writes to the catalog, stock and reservation flags.

Counters never go through Python: every change is one conditional UPDATE
whose WHERE clause states the invariant, and the row count (or RETURNING)
says whether it held. A reservation flag leaves `held` by a conditional
UPDATE on its own row, in the same transaction as the counter change, so
committing or releasing it twice changes the counters once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, connection, transaction
from django.db.models import Expression, F
from django.db.models.functions import Now
from django.utils.translation import gettext as _

from core.db import violated_constraint
from core.errors import ApplicationError
from core.money import check_currency

from . import lock_objects, selectors
from .models import Product, Reservation, StockAdjustment, StockItem

# on_hand stays below this so that on_hand + any accepted delta fits in int4.
MAX_ON_HAND = 1_000_000_000


class SkuExists(ApplicationError):
    status = 409
    code = "sku_exists"
    title = "SKU exists"


@transaction.atomic
def product_create(*, sku: str, name: str, price: Decimal, currency: str, stock: int) -> Product:
    """Create a product with its stock; a taken sku is refused by the unique constraint."""
    check_currency(currency)
    product = Product(sku=sku, name=name, price=price, currency=currency)
    try:
        with transaction.atomic():
            product.save(force_insert=True)
    except IntegrityError as exc:
        if violated_constraint(exc) == "inventory_product_sku_uniq":
            raise SkuExists(
                _("A product with sku {sku!r} already exists.").format(sku=sku)
            ) from exc
        raise
    StockItem.objects.create(product=product, on_hand=stock, reserved=0)
    return product


class StockBelowReserved(ApplicationError):
    status = 409
    code = "stock_below_reserved"
    title = "Stock below reserved"


class StockLimitExceeded(ApplicationError):
    status = 422
    code = "stock_limit_exceeded"
    title = "Stock limit exceeded"


def _stock_hold(*, requests: Mapping[int, int], partial: bool) -> dict[int, Reservation]:
    """Raise `reserved` of each stock item and insert a held flag per item that granted units.

    All-or-nothing per item (`partial=False`): `reserved + q` only where
    `on_hand - reserved >= q`. Partial: `LEAST(q, on_hand - reserved)`.
    Several rows are locked first in primary-key order (one statement), then
    one statement changes all of them and inserts the flags fed by its
    RETURNING; the grant is what the UPDATE added to the value read under
    our own lock, so nothing else can have changed it. A single row first
    tries the plain conditional UPDATE for all `q` units with its flag's
    INSERT (one statement, no lock order to keep); only a shortage takes the
    locked path. Return the flags by stock id (items that granted nothing
    are absent).
    """
    stock_table = connection.ops.quote_name(StockItem._meta.db_table)
    flag_table = connection.ops.quote_name(Reservation._meta.db_table)
    flag_insert = (
        f"INSERT INTO {flag_table} (id, stock_id, quantity, state)"
        " SELECT held.flag, held.id, held.granted, %s FROM held WHERE held.granted > 0"
        " RETURNING id, stock_id, quantity"
    )
    if len(requests) == 1:
        # One row needs no lock order: first the plain conditional UPDATE
        # (the common case, one statement); only a shortage needs the lock.
        ((stock_id, quantity),) = requests.items()
        sql = (
            f"WITH held AS (UPDATE {stock_table} SET reserved = reserved + %s,"
            "  updated_at = statement_timestamp() WHERE id = %s AND on_hand >= reserved + %s"
            "  RETURNING id, %s::integer AS granted, %s::uuid AS flag) "
        ) + flag_insert
        rows = _flags_insert(
            sql, [quantity, stock_id, quantity, quantity, uuid.uuid4(), Reservation.State.HELD]
        )
        if rows or not partial:
            return rows
    locked = lock_objects.stock_items_lock(stock_ids=requests.keys())
    if not locked:
        return {}
    values = ", ".join(["(%s::bigint, %s::integer, %s::integer, %s::uuid)"] * len(locked))
    params: list = []
    for stock_id, (_on_hand, reserved) in locked.items():
        params += [stock_id, requests[stock_id], reserved, uuid.uuid4()]
    if partial:
        grant, guard = "LEAST(r.q, s.on_hand - s.reserved)", "s.on_hand - s.reserved > 0"
    else:
        grant, guard = "r.q", "s.on_hand - s.reserved >= r.q"
    sql = (
        f"WITH held AS (UPDATE {stock_table} AS s SET reserved = s.reserved + {grant},"
        f"  updated_at = now() FROM (VALUES {values}) AS r(id, q, before, flag)"
        f"  WHERE s.id = r.id AND {guard}"
        "  RETURNING s.id, s.reserved - r.before AS granted, r.flag) "
    ) + flag_insert
    return _flags_insert(sql, [*params, Reservation.State.HELD])


def _flags_insert(sql: str, params: list) -> dict[int, Reservation]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return {
        stock_id: Reservation(id=flag, stock_id=stock_id, quantity=quantity)
        for flag, stock_id, quantity in rows
    }


@transaction.atomic(savepoint=False)
def reservations_hold(*, requests: Mapping[int, int], partial: bool) -> dict[int, Reservation]:
    """Reserve units of several stock items at once; return a held flag per granted item.

    `requests` maps stock id to the units wanted. Items that granted nothing
    are absent from the result. With `partial`, an item grants what is
    available up to the request; otherwise all of it or nothing.
    """
    return _stock_hold(requests=requests, partial=partial)


def _resolve(*, reservation_ids: Iterable, state: str) -> list[tuple[int, int]]:
    """Move held flags to `state`; return (stock_id, quantity) of those that moved now."""
    ids = list(reservation_ids)
    if not ids:
        return []
    table = Reservation._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET state = %s, resolved_at = now() "
            "WHERE id = ANY(%s) AND state = 'held' RETURNING stock_id, quantity",
            [state, ids],
        )
        return cursor.fetchall()


def _resolve_one(*, reservation_id, state: str, sold: bool) -> int:
    """Move one held flag to `state` and give its units back, in one statement; return 0 or 1.

    One flag touches one stock row, so no lock order is needed; the stock row
    changes only if the flag moved now (still `held`), as in the many-flag path.
    `sold`: the units leave `on_hand` too (committed), else only `reserved`.
    """
    on_hand = "on_hand = s.on_hand - m.quantity, " if sold else ""
    sql = (
        f"WITH moved AS (UPDATE {Reservation._meta.db_table} SET state = %s,"
        " resolved_at = now() WHERE id = %s AND state = 'held' RETURNING stock_id, quantity)"
        f" UPDATE {StockItem._meta.db_table} AS s SET {on_hand}"
        "reserved = s.reserved - m.quantity, updated_at = statement_timestamp()"
        " FROM moved AS m WHERE s.id = m.stock_id"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [state, reservation_id])
        return cursor.rowcount


def _per_stock(moved: list[tuple[int, int]]) -> dict[int, int]:
    units: dict[int, int] = {}
    for stock_id, quantity in moved:
        units[stock_id] = units.get(stock_id, 0) + quantity
    return units


def _lock_if_several(units: dict[int, int]) -> None:
    """Lock several stock rows in primary-key order before changing them (one needs no order)."""
    if len(units) > 1:
        lock_objects.stock_items_lock(stock_ids=units.keys())


@transaction.atomic(savepoint=False)
def reservations_commit(*, reservation_ids: Iterable) -> int:
    """Sell the units of held flags: take them out of `on_hand` and `reserved` together.

    Flags already committed, released or expired are left alone (a second
    call is harmless). Return how many flags this call committed.
    """
    ids = list(reservation_ids)
    if len(ids) == 1:
        return _resolve_one(reservation_id=ids[0], state=Reservation.State.COMMITTED, sold=True)
    moved = _resolve(reservation_ids=ids, state=Reservation.State.COMMITTED)
    units = _per_stock(moved)
    _lock_if_several(units)
    for stock_id in sorted(units):
        StockItem.objects.filter(id=stock_id).update(
            on_hand=F("on_hand") - units[stock_id],
            reserved=F("reserved") - units[stock_id],
            updated_at=Now(),
        )
    return len(moved)


@transaction.atomic(savepoint=False)
def reservations_release(
    *, reservation_ids: Iterable, state: str = Reservation.State.RELEASED
) -> int:
    """Reset held flags (`released`, or `expired`); their units become available again.

    A flag that already left `held` is left alone. Return how many flags
    this call reset.
    """
    assert state in (Reservation.State.RELEASED, Reservation.State.EXPIRED)
    ids = list(reservation_ids)
    if len(ids) == 1:
        return _resolve_one(reservation_id=ids[0], state=state, sold=False)
    moved = _resolve(reservation_ids=ids, state=state)
    units = _per_stock(moved)
    _lock_if_several(units)
    for stock_id in sorted(units):
        StockItem.objects.filter(id=stock_id).update(
            reserved=F("reserved") - units[stock_id], updated_at=Now()
        )
    return len(moved)


@transaction.atomic(savepoint=False)
def reservations_expire(*, reservation_ids: Iterable) -> int:
    """Reset held flags whose order expired (`expired`): `reservations_release`'s other end."""
    return reservations_release(reservation_ids=reservation_ids, state=Reservation.State.EXPIRED)


@transaction.atomic(savepoint=False)
def stock_restock(*, units: Mapping[uuid.UUID, int]) -> None:
    """Put sold units back on hand: {product id: units} (a received return, a cancelled order).

    `on_hand += units` by F() in the caller's transaction (no savepoint: the
    caller's step-done transition commits with it, or neither does). Stock
    rows are locked in primary-key order when there are several.
    """
    assert all(quantity > 0 for quantity in units.values()), units
    stock_ids = dict(
        StockItem.objects.filter(product_id__in=list(units)).values_list("product_id", "id")
    )
    assert len(stock_ids) == len(units), "every product has its stock row"
    by_stock = {stock_ids[product_id]: quantity for product_id, quantity in units.items()}
    _lock_if_several(by_stock)
    for stock_id in sorted(by_stock):
        StockItem.objects.filter(id=stock_id).update(
            on_hand=F("on_hand") + by_stock[stock_id], updated_at=Now()
        )


def reservations_set_expiry(*, reservation_ids: Iterable, expires_at: datetime | None) -> int:
    """Set when held flags expire; None = never (their order's payment is being decided)."""
    return Reservation.objects.filter(
        id__in=list(reservation_ids), state=Reservation.State.HELD
    ).update(expires_at=expires_at)


@transaction.atomic
def stock_adjust(*, sku: str, delta: int | None = None, set_to: int | None = None) -> StockItem:
    """Change the units on hand of a product by `delta` or to `set_to`.

    `on_hand` never drops below what reservations hold: the condition is in
    the UPDATE itself, so a reservation made a moment earlier is respected.
    """
    assert (delta is None) != (set_to is None), "exactly one of delta and set_to"
    product = selectors.product_get(sku=sku)
    updated = StockItem.objects.filter(product_id=product.id)
    new_on_hand: Expression | int
    if delta is not None:
        assert abs(delta) <= MAX_ON_HAND
        new_on_hand = F("on_hand") + delta
        updated = updated.filter(reserved__lte=new_on_hand, on_hand__lte=MAX_ON_HAND - delta)
    else:
        assert set_to is not None
        if not 0 <= set_to <= MAX_ON_HAND:
            raise StockLimitExceeded(
                _("On hand must be between 0 and {limit}.").format(limit=MAX_ON_HAND)
            )
        new_on_hand = set_to
        updated = updated.filter(reserved__lte=set_to)
    if updated.update(on_hand=new_on_hand, updated_at=Now()) != 1:
        # Only to explain the refusal; the decision was the UPDATE's.
        stock = StockItem.objects.get(product_id=product.id)
        target = stock.on_hand + delta if delta is not None else set_to
        assert target is not None
        if target > MAX_ON_HAND:
            raise StockLimitExceeded(
                _("At most {limit} units may be on hand.").format(limit=MAX_ON_HAND),
                errors={"on_hand": [_("Would be {target}.").format(target=target)]},
            )
        raise StockBelowReserved(
            _("{reserved} units of {sku} are reserved; on hand cannot go below that.").format(
                reserved=stock.reserved, sku=sku
            ),
            extra={"on_hand": stock.on_hand, "reserved": stock.reserved, "requested": target},
        )
    return StockItem.objects.select_related("product").get(product_id=product.id)


FORM_SCOPE_UNIQ = "inventory_stockadjustment_form_scope_uniq"


@transaction.atomic
def stock_adjust_by_staff(
    *,
    sku: str,
    delta: int | None,
    set_to: int | None,
    reason: str,
    by,
    form_scope: str | None = None,
) -> StockItem:
    """`stock_adjust` with who did it and why, in the stock item's admin history.

    The history entry (django.contrib.admin's LogEntry, the stock item's
    "History" page) commits with the change or not at all. With `form_scope`
    (the admin form's owner and key as rendered) a `StockAdjustment` row is inserted
    FIRST: the same form sent again, even after its request key was purged,
    violates `inventory_stockadjustment_form_scope_uniq` and answers the
    stock item as it is, adjusting nothing (docs/idempotency.md, "Business
    scopes that outlive request keys").
    """
    from django.contrib.admin.models import CHANGE, LogEntry

    if form_scope is not None:
        item = StockItem.objects.get(product_id=selectors.product_get(sku=sku).id)
        try:
            with transaction.atomic():
                StockAdjustment.objects.create(
                    stock=item,
                    delta=delta,
                    set_to=set_to,
                    reason=reason[:500],
                    by=by,
                    form_scope=form_scope,
                )
        except IntegrityError as exc:
            if violated_constraint(exc) != FORM_SCOPE_UNIQ:
                raise
            return StockItem.objects.select_related("product").get(pk=item.pk)
    stock = stock_adjust(sku=sku, delta=delta, set_to=set_to)
    change = f"delta {delta:+d}" if delta is not None else f"set to {set_to}"
    LogEntry.objects.log_actions(
        user_id=by.pk,
        queryset=[stock],
        action_flag=CHANGE,
        change_message=f"Adjusted stock ({change}, now {stock.on_hand} on hand): {reason}",
        single_object=True,
    )
    return stock
