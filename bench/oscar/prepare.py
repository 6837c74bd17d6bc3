"""Set up and inspect the Oscar peer's database (run with the Oscar environment's Python).

    python -m bench.oscar.prepare setup --stock N --hot-stock M
        migrate, then the fixtures: one shipping country, the payment source
        and event types the checkout records, one product class, one partner,
        two products with a stock record each (a plentiful one and a hot
        one); prints {"products": {sku: {"id", "url"}}} as JSON.
    python -m bench.oscar.prepare stock SKU
        prints the stock record and the orders of SKU as JSON: num_in_stock,
        num_allocated, the order lines and their quantity.

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.oscar.prepare")
    commands = parser.add_subparsers(dest="command", required=True)
    setup = commands.add_parser("setup")
    setup.add_argument("--stock", type=int, default=10_000_000)
    setup.add_argument("--hot-stock", type=int, default=100)
    stock = commands.add_parser("stock")
    stock.add_argument("sku")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.oscar.settings")
    import django

    django.setup()
    if args.command == "setup":
        result = _setup(args.stock, args.hot_stock)
    else:
        result = _stock(args.sku)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
