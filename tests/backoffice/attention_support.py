"""Rows in every "Needs attention" state, written directly (no provider, no worker)."""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.contrib.auth.models import Permission
from django.db.models.functions import Now

from idempotency.models import Delivery, OutboxMessage
from orders.models import CompensationStep, Order
from orders.states import CompensationKind, OrderStatus, StepName, StepStatus
from payments.models import Payment, PaymentSettlement, PaymentTransaction, Refund


def captured_payment(amount: str = "20.00") -> Payment:
    return Payment.objects.create(
        reference=f"order-{uuid.uuid4().hex[:8]}",
        amount=Decimal(amount),
        currency="EUR",
        payment_method="pm_card_ok",
        status="captured",
        amount_authorized=Decimal(amount),
        amount_captured=Decimal(amount),
    )


def order_of(payment: Payment, owner, *, status: str = OrderStatus.CONFIRMED) -> Order:
    return Order.objects.create(
        owner=owner,
        status=status,
        on_shortage="reject",
        payment_method="pm_card_ok",
        shipping_address={"name": "Ada"},
        currency="EUR",
        total=payment.amount,
        payment=payment,
    )


def flagged_settlement(payment: Payment) -> PaymentSettlement:
    txn = PaymentTransaction.objects.create(
        payment=payment,
        kind="capture",
        provider_key=f"k-{uuid.uuid4().hex}",
        amount=payment.amount,
        currency="EUR",
    )
    return PaymentSettlement.objects.create(
        transaction=txn,
        attempts=12,
        needs_attention=True,
        next_attempt_at=Now(),
        last_error="attempt budget spent (12 attempts): provider timed out",
    )


def flagged_refund(payment: Payment, amount: str = "5.00") -> Refund:
    """A goodwill refund the provider declined: `needs_attention`, its amount reserved."""
    refund_id = uuid.uuid4()
    key = f"install:refund-{refund_id}:refund"
    txn = PaymentTransaction.objects.create(
        payment=payment, kind="refund", provider_key=key, amount=Decimal(amount), currency="EUR"
    )
    Payment.objects.filter(id=payment.id).update(refund_reserved=Decimal(amount))
    return Refund.objects.create(
        id=refund_id,
        payment=payment,
        transaction=txn,
        amount=Decimal(amount),
        currency="EUR",
        reason="goodwill",
        origin="goodwill",
        status="needs_attention",
        provider_key=key,
        needs_attention=True,
        attempts=3,
        last_error="declined by the provider: card_closed",
    )


def failed_step(order: Order) -> CompensationStep:
    """A cancellation's step stopped for staff (`failed`, flagged)."""
    return CompensationStep.objects.create(
        kind=CompensationKind.CANCELLATION,
        order=order,
        name=StepName.NOTIFY,
        position=5,
        status=StepStatus.FAILED,
        needs_attention=True,
        attempts=8,
        last_error="attempt budget spent (8 attempts): SMTP refused",
    )


def dead_letter(order: Order) -> Delivery:
    message = OutboxMessage.objects.create(
        aggregate_type="order",
        aggregate_id=str(order.id),
        event_type="order.confirmed",
        payload={"order_id": str(order.id)},
        done_at=Now(),
    )
    return Delivery.objects.create(
        consumer="loyalty",
        message=message,
        needs_attention=True,
        attempts=5,
        last_error="poison: unknown shopper",
    )


def every_kind(owner) -> dict:
    """One item of each kind, all of one order."""
    payment = captured_payment()
    order = order_of(payment, owner)
    return {
        "order": order,
        "payment": payment,
        "settlement": flagged_settlement(payment),
        "refund": flagged_refund(payment),
        "step": failed_step(order),
        "dead_letter": dead_letter(order),
    }


def grant(user, *codenames: str) -> None:
    """Give `user` these permissions (`app.codename`), and forget its cached ones."""
    for name in codenames:
        app, codename = name.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app, codename=codename)
        )
    for cache in ("_perm_cache", "_user_perm_cache"):
        user.__dict__.pop(cache, None)


VIEW_ALL = (
    "payments.view_paymentsettlement",
    "payments.view_refund",
    "orders.view_compensationstep",
    "idempotency.view_deadletter",
    "orders.view_order",
    "orders.view_returnrequest",
    "payments.view_payment",
    "idempotency.view_delivery",
    "idempotency.view_outboxmessage",
)
