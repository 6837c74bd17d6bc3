"""Tracking reads: the deduplicating read path with 10 % duplicates vs a table without any.

Two shipments of one confirmed order, seeded in the harness process:

- `duplicated`: 1,000 distinct events plus 100 duplicates (10 % of the
  events received twice), stored raw as couriers deliver them;
- `deduplicated`: the same 1,000 events, each received once.

Both are read with `GET /api/v1/shipments/{id}/tracking-events/?page_size=200`
(the first page, the `duplicates_received` count) by the order's shopper
at every concurrency level. The ratio `duplicated_vs_deduplicated`
(req/s) is what reading through `DISTINCT ON` costs when the raw rows
carry duplicates (docs/shipments.md); it is reported, never asserted.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

from bench.loadgen import Request

NAME = "tracking"
DESCRIPTION = "tracking-events read: 1,000 events with 10 % duplicates vs none"
ORDER = 60

EVENTS = 1000
DUPLICATE_SHARE = 0.10
PAGE_SIZE = 200
STATUSES = ("label_created", "picked_up", "in_transit", "out_for_delivery", "delivered")


def seed(*, owner, events: int = EVENTS, duplicate_share: float = DUPLICATE_SHARE) -> dict:
    """Create a confirmed order with two shipments and their events; return their ids."""
    from inventory.services import product_create
    from orders import tracking
    from orders.models import Order
    from orders.services import LineRequest, order_hold, order_payment_record
    from orders.shipments import ShipmentLineRequest, shipment_create

    sku = f"BENCH-TRACK-{uuid.uuid4().hex[:8]}"
    product = product_create(sku=sku, name=sku, price=1, currency="EUR", stock=10)
    product = type(product).objects.select_related("stock").get(pk=product.pk)
    order = order_hold(
        owner=owner,
        lines=[LineRequest(product=product, quantity=2)],
        on_shortage="reject",
        payment_method="pm_card_ok",
        shipping_address={
            "name": "Bench",
            "line1": "1 Load St",
            "city": "Loopback",
            "postal_code": "127",
            "country": "GB",
        },
    )
    order = order_payment_record(order_id=order.id, succeeded=True)
    assert Order.objects.get(id=order.id).status == "confirmed"
    shipments = {
        name: shipment_create(
            order_id=order.id,
            lines=[ShipmentLineRequest(sku=sku, quantity=1)],
            carrier="bench",
            tracking_number=name,
        )
        for name in ("duplicated", "deduplicated")
    }
    start = datetime(2026, 1, 1, tzinfo=UTC)
    rng = random.Random(13)
    base = [
        {
            "event_id": f"ev-{index:05d}",
            "status": STATUSES[index % len(STATUSES)],
            "occurred_at": (start + timedelta(minutes=index)).isoformat(),
            "location": f"hub {index % 17}",
        }
        for index in range(events)
    ]
    twice = set(rng.sample(range(events), int(events * duplicate_share)))

    def received(with_duplicates: bool):
        order_received = list(range(events))
        rng.shuffle(order_received)  # couriers deliver out of order
        for index in order_received:
            yield base[index]
            if with_duplicates and index in twice:
                yield base[index]

    for name, with_duplicates in (("duplicated", True), ("deduplicated", False)):
        tracking.tracking_events_record_many(
            shipment=shipments[name], payloads=received(with_duplicates)
        )
    return {name: str(shipment.id) for name, shipment in shipments.items()}


def run(ctx) -> dict:
    """Read both shipments' first page at every concurrency level; report the ratio."""
    from core.api_tokens import api_tokens_of
    from orders import tracking

    [token] = ctx.tokens(1)
    owner = api_tokens_of([token]).select_related("user").get().user
    ids = seed(owner=owner)
    headers = ctx.auth_headers(token)
    runs, ratios = [], {}
    for concurrency in ctx.concurrency_levels():
        rps = {}
        for label in ("duplicated", "deduplicated"):
            path = f"/api/v1/shipments/{ids[label]}/tracking-events/?page_size={PAGE_SIZE}"
            figures = ctx.load(
                label=label,
                concurrency=concurrency,
                requests=[Request(path=path, headers=headers)],
            )
            runs.append(figures)
            rps[label] = figures.get("rps") or 0
        if rps["deduplicated"]:
            ratios[f"c{concurrency}"] = round(rps["duplicated"] / rps["deduplicated"], 3)
    summaries = {
        label: tracking.tracking_summary(shipment_id=shipment_id)
        for label, shipment_id in ids.items()
    }
    return {
        "events": EVENTS,
        "duplicate_share": DUPLICATE_SHARE,
        "raw_rows": {label: s.received for label, s in summaries.items()},
        "duplicates_received": {label: s.duplicates_received for label, s in summaries.items()},
        "ratios": {"duplicated_vs_deduplicated": ratios},
        "runs": runs,
    }
