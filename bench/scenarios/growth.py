"""Growth: checkout with full tables (100k orders, 1M request keys) and while the purge runs.

Its own simulator and gunicorn (as `checkout`). Three loads of keyed
`POST /api/v1/orders/` at 4 in flight, by SHOPPERS shoppers in turn:

1. `fresh`: the bench database as the earlier scenarios left it;
2. `full`: after a preload in SQL (`INSERT ... SELECT ... generate_series`,
   each row a copy of one real confirmed order of this run with new ids and
   unique values): ORDERS orders, each with its line, committed reservation,
   captured payment, its payment transactions, order and payment events; and
   KEYS finished request keys, PURGEABLE of them finished two days ago (past
   the 24 h retention), the rest in the last hour; all of them owned by
   HISTORIES of the load's SHOPPERS. Then `VACUUM (ANALYZE)` of the loaded
   tables and a `CHECKPOINT` (what autovacuum and the checkpointer do after a
   bulk load, before the load is measured, not during it);
3. `purging`: the same load while `keys_purge` (the beat task's call: its
   batches of IDEMPOTENCY_PURGE_BATCH rows, `FOR UPDATE SKIP LOCKED`, at most
   IDEMPOTENCY_PURGE_MAX_BATCHES a run, paced by IDEMPOTENCY_PURGE_PACE) runs
   run after run in another thread of the harness, with no pause between
   runs: the PURGEABLE backlog keeps it busy for the whole load, the worst
   case of a backlog (docs/performance.md, "The key purge").

Each load lasts LOAD_DURATIONS x `--duration`: the ratios compare loads of
about 3,000 orders, whose rate varies by several per cent from load to load.

Target: orders/s and gunicorn CPU per order of `full` and `purging` within
10 % of `fresh`. Also stored: the EXPLAIN of the hot statements against the
full tables (key read, purge's batch select, a shopper's order list).
Not copied (documented): order events keep `line_id` NULL; settlements,
outbox messages and deliveries are not preloaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time

from bench.context import cpu_ms_per_request
from bench.shop import order_request, shop_with_provider

NAME = "growth"
DESCRIPTION = (
    "checkout orders/s and CPU per order: fresh, with 100k orders + 1M keys, while the purge runs"
)
ORDER = 90

ORDERS, KEYS, PURGEABLE = 100_000, 1_000_000, 900_000
QUICK = (5_000, 50_000, 45_000)
CONCURRENCY = 4
# The load takes turns among SHOPPERS shoppers, as the sustained scenario's: each
# places a few orders a minute, so the limits' read of its last minute stays a few
# rows (docs/checkout.md, "Limits per shopper"). HISTORIES of them own the preload.
SHOPPERS, HISTORIES = 1000, 16
LOAD_DURATIONS = 3
TARGET_FLAT = 0.10


def _columns(cursor, table: str) -> list[str]:
    cursor.execute(
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_name = %s AND table_schema = 'public' AND is_identity = 'NO'"
        " ORDER BY ordinal_position",
        [table],
    )
    return [row[0] for row in cursor.fetchall()]


def _clone(cursor, table: str, where: str, n: int, overrides: dict, params: list) -> int:
    """Copy the rows of `table` matching `where` n times; `overrides` maps a column to an
    SQL expression over `src` and `g` (the copy's number), or None to leave it to its default."""
    columns = [c for c in _columns(cursor, table) if overrides.get(c, "") is not None]
    select = [overrides.get(c) or f"src.{c}" for c in columns]
    cursor.execute(
        f"INSERT INTO {table} ({', '.join(columns)})"
        f" SELECT {', '.join(select)} FROM {table} AS src"
        f" CROSS JOIN generate_series(1, {int(n)}) AS g WHERE {where}",
        params,
    )
    return cursor.rowcount


def _ids(prefix: str) -> tuple[str, str, str]:
    """SQL for the ids of copy g: order, payment, reservation (md5 of `prefix` and g)."""
    return (
        f"md5('{prefix}-order-' || g)::uuid",
        f"md5('{prefix}-payment-' || g)::uuid",
        f"md5('{prefix}-reservation-' || g)::uuid",
    )


def preload(
    ctx, owners: list[int], orders: int, keys: int, purgeable: int, *, prefix: str = "growth"
) -> dict:
    """Copy one confirmed order `orders` times and its key `keys` times (module docstring).

    `prefix` makes the copies' ids and keys (two preloads with different
    prefixes never collide; `unload` removes one preload's rows).
    """
    from django.db import connection, transaction

    from orders.models import Order

    template = Order.objects.filter(status="confirmed", payment__isnull=False).latest("number")
    owner = f"(%s::int[])[1 + g %% {len(owners)}]"
    oid, pid, rid = _ids(prefix)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reservation_id FROM orders_orderline WHERE order_id = %s", [template.id]
        )
        [reservation_id] = [row[0] for row in cursor.fetchall()][:1]
        cursor.execute(
            "SELECT id FROM idempotency_idempotencykey WHERE data->>'order_id' = %s LIMIT 1",
            [str(template.id)],
        )
        [key_id] = [row[0] for row in cursor.fetchall()][:1]
    ago = "now() - interval '30 days' + g * interval '1 second'"
    counts: dict = {}
    steps = [
        (
            "payments_payment",
            "src.id = %s",
            orders,
            {"id": pid, "reference": "src.reference || '-g' || g", "owner_id": owner},
            [owners, template.payment_id],
        ),
        (
            "inventory_reservation",
            "src.id = %s",
            orders,
            {"id": rid, "created_at": ago, "resolved_at": ago},
            [reservation_id],
        ),
        (
            "orders_order",
            "src.id = %s",
            orders,
            {
                "id": oid,
                "number": None,
                "payment_id": pid,
                "owner_id": owner,
                "created_at": ago,
                "updated_at": ago,
            },
            [owners, template.id],
        ),
        (
            "orders_orderline",
            "src.order_id = %s",
            orders,
            {"order_id": oid, "reservation_id": rid},
            [template.id],
        ),
        (
            "orders_orderevent",
            "src.order_id = %s",
            orders,
            {"order_id": oid, "line_id": "NULL", "created_at": ago},
            [template.id],
        ),
        (
            "payments_paymentevent",
            "src.payment_id = %s",
            orders,
            {"payment_id": pid},
            [template.payment_id],
        ),
        (
            "payments_paymenttransaction",
            "src.payment_id = %s",
            orders,
            {"payment_id": pid, "provider_key": "src.provider_key || '-g' || g"},
            [template.payment_id],
        ),
        (
            "idempotency_idempotencykey",
            "src.id = %s",
            keys,
            {
                "key": f"'{prefix}-' || g",
                "owner_id": owner,
                # The first `purgeable` finished two days ago (past the retention), the rest lately.
                "finished_at": f"CASE WHEN g <= {int(purgeable)}"
                " THEN now() - interval '2 days' - g * interval '10 ms'"
                " ELSE now() - g * interval '1 ms' END",
                "created_at": "now() - interval '3 days'",
                "last_run_at": "now() - interval '3 days'",
            },
            [owners, key_id],
        ),
    ]
    for table, where, n, overrides, params in steps:
        started = time.monotonic()
        with transaction.atomic(), connection.cursor() as cursor:
            counts[table] = _clone(cursor, table, where, n, overrides, params)
        ctx.log(f"  preload {table}: {counts[table]:,} rows in {time.monotonic() - started:.1f} s")
    started = time.monotonic()
    with connection.cursor() as cursor:
        for table, *_ in steps:
            cursor.execute(f"VACUUM (ANALYZE) {table}")
        cursor.execute("CHECKPOINT")
    ctx.log(f"  VACUUM (ANALYZE) and CHECKPOINT: {time.monotonic() - started:.1f} s")
    return counts


def unload(ctx, orders: int, *, prefix: str) -> dict:
    """Delete the rows `preload(..., prefix=prefix)` added (children first, one transaction)."""
    from django.db import connection, transaction

    oid, pid, rid = _ids(prefix)
    series = f"FROM generate_series(1, {int(orders)}) AS g"
    steps = [
        ("orders_orderevent", f"order_id IN (SELECT {oid} {series})"),
        ("orders_orderline", f"order_id IN (SELECT {oid} {series})"),
        ("orders_order", f"id IN (SELECT {oid} {series})"),
        ("inventory_reservation", f"id IN (SELECT {rid} {series})"),
        ("payments_paymentevent", f"payment_id IN (SELECT {pid} {series})"),
        ("payments_paymenttransaction", f"payment_id IN (SELECT {pid} {series})"),
        ("payments_payment", f"id IN (SELECT {pid} {series})"),
        ("idempotency_idempotencykey", f"key LIKE '{prefix}-%'"),
    ]
    deleted = {}
    started = time.monotonic()
    with transaction.atomic(), connection.cursor() as cursor:
        for table, where in steps:
            cursor.execute(f"DELETE FROM {table} WHERE {where}")
            deleted[table] = cursor.rowcount
    ctx.log(f"  unloaded the {prefix} copies in {time.monotonic() - started:.1f} s: {deleted}")
    return deleted


def _explain(owner_id: int) -> dict:
    from django.db import connection

    statements = {
        "key read (owner, key)": (
            "SELECT * FROM idempotency_idempotencykey WHERE owner_id = %s AND key = %s",
            [owner_id, "growth-12345"],
        ),
        "purge batch": (
            "SELECT id FROM idempotency_idempotencykey WHERE recovery_point = 'finished'"
            " AND finished_at < now() - make_interval(secs => 86400) ORDER BY finished_at"
            " LIMIT 1000 FOR UPDATE SKIP LOCKED",
            [],
        ),
        "a shopper's orders, newest first": (
            "SELECT * FROM orders_order WHERE owner_id = %s ORDER BY number DESC LIMIT 51",
            [owner_id],
        ),
    }
    plans = {}
    with connection.cursor() as cursor:
        for name, (sql, params) in statements.items():
            cursor.execute("EXPLAIN " + sql, params)
            plans[name] = [row[0] for row in cursor.fetchall()]
    return plans


class _Purger(threading.Thread):
    """Run keys_purge as beat calls it, run after run until stopped (its own connection);
    time each batch's DELETE, the figure its capacity depends on."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.deleted = 0
        self.batches = 0
        self.runs = 0
        self.batch_seconds: list[float] = []
        self.error: str | None = None

    def _timed(self, execute, sql, params, many, context):
        started = time.monotonic()
        try:
            return execute(sql, params, many, context)
        finally:
            if sql.startswith("DELETE"):
                self.batch_seconds.append(time.monotonic() - started)

    def run(self) -> None:
        from django.conf import settings
        from django.db import connection

        from idempotency.keys.purge import keys_purge

        try:
            with connection.execute_wrapper(self._timed):
                self._runs(keys_purge, int(settings.IDEMPOTENCY_PURGE_BATCH))
        except Exception as exc:  # noqa: BLE001 - reported in the results
            self.error = repr(exc)
        finally:
            connection.close()

    def _runs(self, keys_purge, batch: int) -> None:
        while not self.stop.is_set():
            deleted = keys_purge()
            self.deleted += deleted
            self.batches += -(-deleted // batch)
            self.runs += 1
            if not deleted:
                self.stop.wait(0.5)

    def figures(self) -> dict:
        """What the purge did during the load, and its capacity at the median batch time."""
        from idempotency.keys.purge import keys_purge_capacity

        timed = sorted(self.batch_seconds)
        median = timed[len(timed) // 2] if timed else None
        return {
            "deleted_during_load": self.deleted,
            "batches": self.batches,
            "runs": self.runs,
            "delete_ms_p50": round(median * 1000, 2) if median is not None else None,
            "delete_ms_max": round(timed[-1] * 1000, 2) if timed else None,
            "capacity_keys_per_s": (
                round(keys_purge_capacity(batch_seconds=median)) if median is not None else None
            ),
            "error": self.error,
        }


def _figures(run: dict) -> dict:
    return {"orders_per_s": run["rps"], "cpu_ms_per_order": cpu_ms_per_request(run)}


def run(ctx) -> dict:
    from core.api_tokens import api_tokens_of

    orders, keys, purgeable = QUICK if ctx.quick else (ORDERS, KEYS, PURGEABLE)
    tokens = ctx.tokens(SHOPPERS)
    owners = list(api_tokens_of(tokens[:HISTORIES]).values_list("user_id", flat=True))
    headers = [ctx.auth_headers(token) for token in tokens]
    skus = list(ctx.skus)
    with contextlib.ExitStack() as stack:
        _, _, server = shop_with_provider(stack, ctx, prefix="bench-growth-")
        shop = dataclasses.replace(ctx, base_url=server.base_url, server=server)

        def order(worker: int, seq: int):
            return order_request(
                headers[(seq * CONCURRENCY + worker) % len(headers)],
                skus[(worker * 7919 + seq) % len(skus)],
            )

        def load(label: str) -> dict:
            return shop.load(
                label=label,
                concurrency=CONCURRENCY,
                factory=order,
                duration=LOAD_DURATIONS * ctx.duration,
                expected=(201,),
            )

        # Warm every worker (imports, pooled connections, the install id, each connection's
        # prepared statements) for one `--duration` before measuring.
        shop.load(label="warm", concurrency=CONCURRENCY, factory=order, expected=(201,))
        fresh = load("fresh")
        counts = preload(ctx, owners, orders, keys, purgeable)
        full = load("full")
        purger = _Purger()
        purger.start()
        try:
            purging = load("purging")
        finally:
            purger.stop.set()
            purger.join(60)
        plans = _explain(owners[0])
    figures = {name: _figures(r) for name, r in (("fresh", fresh), ("full", full))}
    figures["purging"] = _figures(purging)
    ratios = {}
    for name in ("full", "purging"):
        rps = figures[name]["orders_per_s"] / fresh["rps"] if fresh["rps"] else None
        cpu_fresh = figures["fresh"]["cpu_ms_per_order"]
        cpu = figures[name]["cpu_ms_per_order"] / cpu_fresh if cpu_fresh else None
        ratios[name] = {
            "orders_per_s_vs_fresh": round(rps, 3) if rps is not None else None,
            "cpu_per_order_vs_fresh": round(cpu, 3) if cpu is not None else None,
        }
    purge = purger.figures()
    ctx.log(f"  growth: {figures}; vs fresh {ratios}; purge {purge}")
    return {
        "runs": [fresh, full, purging],
        "preloaded_rows": counts,
        "purgeable_keys": purgeable,
        "figures": figures,
        "ratios": ratios,
        "purge": purge,
        "explain": plans,
        "targets": {"flat_within": TARGET_FLAT},
    }
