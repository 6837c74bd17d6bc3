"""Helpers of the refund tests: captured payments at the real simulator, signed refund events."""

from __future__ import annotations

import json
import time
import uuid
from decimal import Decimal

from django.conf import settings

from payments import webhooks
from payments.capture import payment_capture, payment_create, payment_lookup_once
from payments.models import Payment, PaymentStatus


def captured(reference: str | None = None, amount: str = "20.00", method: str = "pm_card_ok"):
    """A payment captured at the provider (a lost capture answer is looked up)."""
    payment = payment_create(
        reference=reference or f"order-{uuid.uuid4().hex[:8]}",
        amount=Decimal(amount),
        currency="EUR",
        payment_method=method,
    )
    if payment_capture(payment_id=payment.id).outcome == "unknown":
        payment_lookup_once(payment_id=payment.id)
    payment = Payment.objects.get(id=payment.id)
    assert payment.status == PaymentStatus.CAPTURED
    return payment


def refund_event(*, key: str, amount: str, kind: str = "refund.succeeded", event_id=None):
    """A signed refund webhook (body, signature header) for the refund under `key`."""
    body = json.dumps(
        {
            "id": event_id or f"evt_{uuid.uuid4().hex}",
            "type": kind,
            "created": int(time.time()),
            "data": {
                "provider_key": key,
                "reference": "order-x",
                "amount": amount,
                "currency": "EUR",
                "operation_id": "op_test",
            },
        }
    ).encode()
    header = webhooks.sign(
        secret=settings.PAYMENTS_WEBHOOK_SECRET, timestamp=int(time.time()), body=body
    )
    return body, header


def provider_refunds(simulator, key_prefix: str = "") -> list[dict]:
    """Succeeded refunds in the provider's ledger."""
    return [
        op
        for op in simulator.ledger(key_prefix)
        if op["kind"] == "refund" and op["status"] == "succeeded"
    ]
