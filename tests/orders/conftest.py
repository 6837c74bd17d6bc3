"""Fixtures of the orders tests."""

from __future__ import annotations

import pytest

from inventory.models import Product
from orders.services import LineRequest, order_hold

ADDRESS = {
    "name": "Ada Lovelace",
    "line1": "1 Analytical Way",
    "city": "London",
    "postal_code": "N1 9GU",
    "country": "GB",
}


def line_requests(lines: dict[str, int]) -> list[LineRequest]:
    products = {p.sku: p for p in Product.objects.select_related("stock").filter(sku__in=lines)}
    return [LineRequest(product=products[sku], quantity=q) for sku, q in lines.items()]


@pytest.fixture
def reserve(shopper):
    """Place an order's reservations (phase 1 without the payment) for `lines` {sku: qty}."""

    def place(lines: dict[str, int], *, on_shortage: str = "reject", owner=None, **kwargs):
        return order_hold(
            owner=owner or shopper,
            lines=line_requests(lines),
            on_shortage=on_shortage,
            payment_method=kwargs.pop("payment_method", "pm_card_ok"),
            shipping_address=kwargs.pop("shipping_address", ADDRESS),
            **kwargs,
        )

    return place


@pytest.fixture
def provider(tmp_path, settings):
    """A real payment simulator process; the shop (this process) points at it."""
    from tests.support.simulator import Simulator

    simulator = Simulator(tmp_path).start()
    settings.PAYMENTS_PROVIDER_URL = simulator.url
    settings.PAYMENTS_PROVIDER_TIMEOUT = 1.0
    yield simulator
    simulator.stop()
