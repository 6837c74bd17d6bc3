"""Catalog reads: the public product list and product pages, nothing written."""

from __future__ import annotations

from bench.loadgen import Request

NAME = "catalog_reads"
DESCRIPTION = "GET /api/v1/products/ (first page, 50 products) and /products/{sku}/"
ORDER = 10


def run(ctx) -> dict:
    """Load the list and the detail endpoint, each at every concurrency level."""
    list_requests = [Request(path="/api/v1/products/")]
    detail_requests = [Request(path=f"/api/v1/products/{sku}/") for sku in ctx.skus]
    runs = []
    for label, requests in (("list", list_requests), ("detail", detail_requests)):
        for concurrency in ctx.concurrency_levels():
            runs.append(ctx.load(label=label, concurrency=concurrency, requests=requests))
    return {"products": len(ctx.skus), "runs": runs}
