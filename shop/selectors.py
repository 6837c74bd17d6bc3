"""Reads of the storefront pages that other apps' selectors do not answer as the pages need.

Kept out of the views (which parse input and call one service or selector):
an order's shipments, and its returns' lines and compensation steps.
"""

from __future__ import annotations

from orders.models import CompensationStep, ReturnLine, Shipment


def shipments_of_order(*, order_id) -> list[Shipment]:
    """The order's shipments, oldest first."""
    return list(Shipment.objects.filter(order_id=order_id).order_by("created_at", "id"))


def return_lines_of(*, return_ids: list) -> dict:
    """{return id: [its lines, in order]} for the given returns."""
    lines: dict = {}
    for line in ReturnLine.objects.filter(order_return_id__in=return_ids).order_by("id"):
        lines.setdefault(line.order_return_id, []).append(line)
    return lines


def return_steps_of(*, return_ids: list) -> dict:
    """{return id: [its compensation steps, by position]} for the given returns."""
    steps: dict = {}
    for step in CompensationStep.objects.filter(order_return_id__in=return_ids).order_by(
        "position"
    ):
        steps.setdefault(step.order_return_id, []).append(step)
    return steps
