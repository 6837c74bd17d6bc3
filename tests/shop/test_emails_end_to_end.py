"""The four shopper e-mails from real events, through the outbox, the relay and the consumer.

An order confirmed, another one's payment declined, the first one shipped with
a tracking number and partly refunded: each writes its outbox message in its
own transaction; the relay (in this process) writes the deliveries and rings
the e-mail consumer, whose task body runs here and writes the mail rows; its
bell rings the sender (`shop.send_mail`), whose body runs here too. Each mail
arrives once with a plain-text and an HTML part; the same message ids
delivered again write and send nothing (the inbox), docs/events.md.
"""

from __future__ import annotations

import pytest
from celery import current_app
from django.core import mail
from django.core.mail import EmailMultiAlternatives

from idempotency.messaging import relay
from idempotency.models import Delivery
from orders.models import Order
from payments.refunds import refund_run
from shop import emails
from shop.models import Mail
from shop.tasks import consume_emails, send_mail
from tests.orders.conftest import ADDRESS
from tests.orders.shipping import ship

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def emails_on(settings, monkeypatch):
    """SHOP_EMAILS as in production (the test settings turn it off): the consumer subscribed."""
    settings.SHOP_EMAILS = True
    monkeypatch.setattr(relay, "_consumers", relay.consumers())  # restored after the test
    relay.register_consumer(
        emails.CONSUMER, task="shop.consume_emails", event_types=emails.EVENT_TYPES
    )


@pytest.fixture
def rung(monkeypatch) -> list[tuple[str, list]]:
    """Every task the shop publishes, recorded instead of sent (no worker: we play it)."""
    sent: list[tuple[str, list]] = []
    monkeypatch.setattr(
        current_app, "send_task", lambda name, args=None, **kw: sent.append((name, args or []))
    )
    return sent


def place_order(client, lines: dict[str, int], *, key: str, method: str = "pm_card_ok"):
    return client.post(
        "/api/v1/orders/",
        {
            "lines": [{"sku": sku, "quantity": q} for sku, q in lines.items()],
            "payment_method": method,
            "shipping_address": ADDRESS,
        },
        format="json",
        HTTP_IDEMPOTENCY_KEY=key,
    )


def relay_all() -> None:
    while relay.relay_once() > 0:
        pass


def test_the_four_mails_arrive_once_each_with_both_parts(
    emails_on, rung, provider, make_product, shopper, shopper_client, staff_client
):
    make_product("TEE-M", price="10.00", stock=10)
    confirmed = place_order(shopper_client, {"TEE-M": 2}, key="order-ok")
    assert confirmed.status_code == 201, confirmed.content
    order = Order.objects.get(id=confirmed.json()["id"])
    declined = place_order(shopper_client, {"TEE-M": 1}, key="order-no", method="pm_card_declined")
    assert declined.status_code == 402, declined.content
    ship(order, carrier="DHL", tracking_number="TRK-4242")
    refund = staff_client.post(
        f"/api/v1/orders/{order.id}/refunds/",
        {"amount": "5.00", "currency": "EUR", "reason": "late delivery"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="refund-1",
    )
    assert refund.status_code == 201, refund.content
    refund_run(refund_id=refund.json()["id"])  # the refund task's body: the provider refunds

    relay_all()
    ids = [i for name, args in rung if name == "shop.consume_emails" for i in args[0]]
    assert len(ids) == 4 == Delivery.objects.filter(consumer=emails.CONSUMER).count()
    consume_emails.apply(args=[ids])
    assert mail.outbox == []  # the deliveries are done before any mail is sent
    assert not Delivery.objects.filter(consumer=emails.CONSUMER, done_at__isnull=True).exists()
    bells = [args[0] for name, args in rung if name == "shop.send_mail"]
    assert sorted(i for bell in bells for i in bell) == sorted(
        Mail.objects.values_list("id", flat=True)
    )
    for bell in bells:
        send_mail.apply(args=[bell])

    failed = Order.objects.get(id=declined.json()["order_id"])
    assert sorted(message.subject for message in mail.outbox) == sorted(
        [
            f"Your order {order.number} is confirmed",
            f"Payment for order {failed.number} was declined",
            f"Your order {order.number} has shipped",
            f"Your refund for order {order.number}",
        ]
    )
    for message in mail.outbox:
        assert isinstance(message, EmailMultiAlternatives)
        assert message.to == [shopper.email]
        assert message.body.strip()  # the plain-text part
        ((html, mimetype),) = message.alternatives
        assert mimetype == "text/html" and "<" in html
    shipped = next(m for m in mail.outbox if "shipped" in m.subject)
    assert "TRK-4242" in shipped.body and "TRK-4242" in shipped.alternatives[0][0]

    # The same message ids delivered again (a redelivery): the inbox writes nothing new,
    # and the bells rung again send nothing (the rows are done).
    consume_emails.apply(args=[ids])
    assert Mail.objects.count() == 4
    for bell in bells:
        send_mail.apply(args=[bell])
    assert len(mail.outbox) == 4
    assert not Mail.objects.filter(done_at__isnull=True).exists()
    assert not Delivery.objects.filter(consumer=emails.CONSUMER, done_at__isnull=True).exists()
