"""The API's answer to the keyed stock adjustment: a domain result → status and body.

Declared for the completer too (`keyed_operation`).
"""

from __future__ import annotations

from idempotency.keys import Reply, Result, keyed_operation

from .. import operations
from ..models import StockItem


def stock_body(stock: StockItem) -> dict:
    """Render the stock endpoint's answer."""
    return {
        "sku": stock.product.sku,
        "on_hand": stock.on_hand,
        "reserved": stock.reserved,
        "available": stock.on_hand - stock.reserved,
    }


@keyed_operation(operations.STOCK_ADJUST)
def stock_adjusted(result: Result) -> Reply:
    """POST /products/{sku}/stock/: 200 with the stock, or the refusal's problem."""
    if result.refusal is not None:
        return Reply.for_problem(result.refusal)
    return Reply(status=200, body=stock_body(result.value))
