"""Set up and inspect the Oscar peer's database (run with the Oscar environment's Python).

    python -m bench.oscar.prepare setup --stock N --hot-stock M
        migrate, then the fixtures: one shipping country, the payment source
        and event types the checkout records, one product class, one partner,
        two products with a stock record each (a plentiful one and a hot
        one); prints {"products": {sku: {"id", "url"}}} as JSON.
    python -m bench.oscar.prepare stock SKU
        prints the stock record and the orders of SKU as JSON: num_in_stock,
        num_allocated, the order lines and their quantity.
    python -m bench.oscar.prepare orders N
        adds N orders in SQL, each a copy of the last order placed through
        the checkout (see `_orders`); prints the rows added per table and
        what Oscar's ORM then counts, as JSON.

Oscar ships with one shipping method (free) and no payment gateway; guest
checkout is on in bench.oscar.settings.
"""

import argparse
import json
import os
import sys
from decimal import Decimal


def _setup(stock: int, hot_stock: int) -> dict:
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    from oscar.apps.address.models import Country
    from oscar.apps.catalogue.models import Product, ProductClass
    from oscar.apps.order.models import PaymentEventType
    from oscar.apps.partner.models import Partner, StockRecord
    from oscar.apps.payment.models import SourceType

    Country.objects.update_or_create(
        iso_3166_1_a2="DE",
        defaults={
            "iso_3166_1_a3": "DEU",
            "iso_3166_1_numeric": "276",
            "printable_name": "Germany",
            "name": "Federal Republic of Germany",
            "is_shipping_country": True,
        },
    )
    # What bench.oscar.checkout.views records per order; made here, as a shop
    # has them before its first sale (get_or_create racing on the unique code
    # would refuse concurrent first orders).
    SourceType.objects.get_or_create(name="Bench dummy")
    PaymentEventType.objects.get_or_create(name="Settled")
    product_class, _ = ProductClass.objects.get_or_create(
        name="Bench", defaults={"requires_shipping": True, "track_stock": True}
    )
    partner, _ = Partner.objects.get_or_create(name="Bench partner")
    products = {}
    for sku, units in (("BENCH-0001", stock), ("HOT", hot_stock)):
        product, _ = Product.objects.get_or_create(
            upc=sku,
            defaults={
                "title": f"Bench product {sku}",
                "product_class": product_class,
                "structure": Product.STANDALONE,
            },
        )
        StockRecord.objects.update_or_create(
            product=product,
            partner=partner,
            defaults={
                "partner_sku": sku,
                "price": Decimal("10.00"),
                "price_currency": "EUR",
                "num_in_stock": units,
                "num_allocated": 0,
            },
        )
        products[sku] = {"id": product.pk, "url": product.get_absolute_url()}
    return {"products": products}


def _stock(sku: str) -> dict:
    from django.db.models import Sum
    from oscar.apps.order.models import Line
    from oscar.apps.partner.models import StockRecord

    record = StockRecord.objects.get(partner_sku=sku)
    lines = Line.objects.filter(stockrecord=record)
    return {
        "sku": sku,
        "num_in_stock": record.num_in_stock,
        "num_allocated": record.num_allocated or 0,
        "order_lines": lines.count(),
        "units_ordered": lines.aggregate(units=Sum("quantity"))["units"] or 0,
    }


PRELOAD_PREFIX = "B100K-"


def _children(template_id: int) -> list[tuple[type, list[int]]]:
    """The template order and every row hanging from it, parents before children.

    A row hangs from the order when one of its foreign keys points at the
    order or at a row that hangs from it (lines, line prices, payment events
    and their quantities, sources, transactions, notes, status changes...).
    Rows it only points at (product, stock record, basket, addresses) are
    shared by the copies, as many orders share a product.
    """
    from django.apps import apps
    from oscar.apps.order.models import Order

    rows: dict[type, set[int]] = {Order: {template_id}}
    models = [m for m in apps.get_models(include_auto_created=True) if m is not Order]
    changed = True
    while changed:
        changed = False
        for model in models:
            for field in model._meta.concrete_fields:
                parent = field.related_model if field.many_to_one or field.one_to_one else None
                if parent not in rows:
                    continue
                found = set(
                    model._default_manager.filter(
                        **{f"{field.attname}__in": rows[parent]}
                    ).values_list("pk", flat=True)
                )
                if not found <= rows.get(model, set()):
                    rows[model] = rows.get(model, set()) | found
                    changed = True
    ordered: list[type] = []
    while len(ordered) < len(rows):
        for model in rows:
            if model in ordered:
                continue
            parents = {
                f.related_model
                for f in model._meta.concrete_fields
                if (f.many_to_one or f.one_to_one) and f.related_model in rows
            } - {model}
            if parents <= set(ordered):
                ordered.append(model)
    return [(model, sorted(rows[model])) for model in ordered]


def _orders(count: int) -> dict:
    """Add `count` orders, copies of the last placed one, with `INSERT ... SELECT generate_series`.

    Copy g of a row of table t gets the id base_t + (g - 1) x k_t + its rank
    among the template's k_t rows of t (base_t: the table's highest id), so
    a copied child points at the copy of its parent by the same arithmetic;
    the order number is PRELOAD_PREFIX + g (Oscar numbers its orders
    100000 + basket id) and the copies were placed over the last `count`
    seconds. Each table's id sequence is moved past the copies. Then ANALYZE.
    """
    from django.db import connection, transaction
    from django.db.models import Max
    from oscar.apps.order.models import Line, Order

    template = Order.objects.exclude(number__startswith=PRELOAD_PREFIX).latest("id")
    plan = _children(template.id)
    added: dict[str, int] = {}
    with transaction.atomic(), connection.cursor() as cursor:
        copied: dict[type, tuple[int, list[int]]] = {}
        for model, ids in plan:
            table = model._meta.db_table
            pk = model._meta.pk
            if pk.get_internal_type() not in ("AutoField", "BigAutoField"):
                raise RuntimeError(f"{table}: primary key {pk.column} is not an integer id")
            base = model._default_manager.aggregate(top=Max("pk"))["top"] or 0
            k = len(ids)
            select, params = [], []
            for field in model._meta.concrete_fields:
                column = connection.ops.quote_name(field.column)
                if field is pk:
                    select.append(
                        f"{base} + (g - 1) * {k} + array_position(%s::bigint[], src.{column})"
                    )
                    params.append(ids)
                elif model is Order and field.name == "number":
                    select.append("%s || g")
                    params.append(PRELOAD_PREFIX)
                elif model is Order and field.name == "date_placed":
                    select.append(f"now() - ({int(count)} - g) * interval '1 second'")
                elif (field.many_to_one or field.one_to_one) and field.related_model in copied:
                    pbase, pids = copied[field.related_model]
                    position = f"array_position(%s::bigint[], src.{column})"
                    select.append(
                        f"CASE WHEN {position} IS NULL THEN src.{column}"
                        f" ELSE {pbase} + (g - 1) * {len(pids)} + {position} END"
                    )
                    params += [pids, pids]
                else:
                    select.append(f"src.{column}")
            columns = ", ".join(
                connection.ops.quote_name(f.column) for f in model._meta.concrete_fields
            )
            cursor.execute(
                f"INSERT INTO {connection.ops.quote_name(table)} ({columns})"
                f" SELECT {', '.join(select)} FROM {connection.ops.quote_name(table)} AS src"
                f" CROSS JOIN generate_series(1, %s) AS g"
                f" WHERE src.{connection.ops.quote_name(pk.column)} = ANY(%s::bigint[])",
                [*params, count, ids],
            )
            added[table] = cursor.rowcount
            copied[model] = (base, ids)
            cursor.execute(
                "SELECT setval(pg_get_serial_sequence(%s, %s),"
                f" (SELECT max({connection.ops.quote_name(pk.column)}) FROM"
                f" {connection.ops.quote_name(table)}))",
                [table, pk.column],
            )
    with connection.cursor() as cursor:
        for model, _ in plan:
            cursor.execute(f"ANALYZE {connection.ops.quote_name(model._meta.db_table)}")
    # What Oscar's own ORM makes of the copies: counted, and one read whole.
    last = Order.objects.get(number=f"{PRELOAD_PREFIX}{count}")
    return {
        "template_order": template.number,
        "rows_added": added,
        "orm_orders": Order.objects.count(),
        "orm_preloaded_orders": Order.objects.filter(number__startswith=PRELOAD_PREFIX).count(),
        "orm_lines": Line.objects.count(),
        "orm_last_copy": {
            "number": last.number,
            "lines": last.lines.count(),
            "total_incl_tax": str(last.total_incl_tax),
            "payment_events": last.payment_events.count(),
            "sources": last.sources.count(),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.oscar.prepare")
    commands = parser.add_subparsers(dest="command", required=True)
    setup = commands.add_parser("setup")
    setup.add_argument("--stock", type=int, default=10_000_000)
    setup.add_argument("--hot-stock", type=int, default=100)
    stock = commands.add_parser("stock")
    stock.add_argument("sku")
    orders = commands.add_parser("orders")
    orders.add_argument("count", type=int)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.oscar.settings")
    import django

    django.setup()
    if args.command == "setup":
        result = _setup(args.stock, args.hot_stock)
    elif args.command == "orders":
        result = _orders(args.count)
    else:
        result = _stock(args.sku)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
