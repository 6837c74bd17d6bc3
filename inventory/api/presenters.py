"""The API's answer to the keyed stock adjustment: a domain result → status and body.

Registered for the completer too (inventory/apps.py).
"""

from __future__ import annotations

from idempotency.operations import Reply, Result

from ..models import StockItem


def stock_body(stock: StockItem) -> dict:
    """Render the stock endpoint's answer."""
    return {
        "sku": stock.product.sku,
        "on_hand": stock.on_hand,
        "reserved": stock.reserved,
        "available": stock.on_hand - stock.reserved,
    }


def stock_adjusted(result: Result) -> Reply:
    """POST /products/{sku}/stock/: 200 with the stock, or the refusal's problem."""
    if result.refusal is not None:
        return Reply.for_problem(result.refusal)
    return Reply(status=200, body=stock_body(result.value))
