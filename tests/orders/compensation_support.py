"""Helpers of the return and cancellation tests: paid (and shipped) orders, driving steps here."""

from __future__ import annotations

import time
from decimal import Decimal

from django.db.models.functions import Now

from orders.compensation import step_run
from orders.models import CompensationStep, Order
from payments.models import Refund, RefundStatus
from payments.refunds import refund_run
from tests.orders.conftest import ADDRESS
from tests.orders.shipping import ship

RETURNS = "/api/v1/orders/{}/returns/"
RECEIVE = "/api/v1/returns/{}/receive/"
RETURN = "/api/v1/returns/{}/"


def paid_order(client, lines: dict[str, int], key: str = "order-1") -> Order:
    """Place and pay an order through the API (the simulator captures it)."""
    response = client.post(
        "/api/v1/orders/",
        {
            "lines": [{"sku": sku, "quantity": q} for sku, q in lines.items()],
            "payment_method": "pm_card_ok",
            "shipping_address": ADDRESS,
        },
        format="json",
        HTTP_IDEMPOTENCY_KEY=key,
    )
    assert response.status_code == 201, response.content
    order = Order.objects.select_related("payment").get(id=response.json()["id"])
    assert order.payment.amount_captured == order.total > Decimal(0)
    return order


def shipped_order(client, lines: dict[str, int], key: str = "order-1") -> Order:
    order = paid_order(client, lines, key=key)
    ship(order)
    return order


def ask_return(client, order, lines: dict[str, int], key: str = "ret-1", reason: str = "too big"):
    return client.post(
        RETURNS.format(order.id),
        {"lines": [{"sku": sku, "quantity": q} for sku, q in lines.items()], "reason": reason},
        format="json",
        HTTP_IDEMPOTENCY_KEY=key,
    )


def receive(client, return_id, key: str = "rcv-1"):
    return client.post(RECEIVE.format(return_id), format="json", HTTP_IDEMPOTENCY_KEY=key)


def steps_of(**filters):
    return CompensationStep.objects.filter(**filters).order_by("position")


def drive(*, timeout: float = 30.0, **filters) -> None:
    """Play worker and beat in this process: run due steps and refunds until none is pending."""
    deadline = time.monotonic() + timeout
    while True:
        steps = list(steps_of(**filters))
        failed = {s.name for s in steps if s.needs_attention}
        pending = [
            s
            for s in steps
            if s.done_at is None and not s.needs_attention and s.after not in failed
        ]
        if not pending:
            return  # done, or parked behind a step that needs attention
        assert time.monotonic() < deadline, [(s.name, s.status, s.last_error) for s in pending]
        for refund in Refund.objects.filter(status=RefundStatus.PENDING):
            Refund.objects.filter(id=refund.id).update(next_attempt_at=Now())
            refund_run(refund_id=refund.id)
        for step in pending:
            CompensationStep.objects.filter(id=step.id).update(next_attempt_at=Now())
            step_run(step_id=step.id)
