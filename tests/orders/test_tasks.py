from datetime import timedelta

import pytest
from django.db.models.functions import Now

from orders.models import Order
from orders.tasks import expire_reservations

pytestmark = pytest.mark.django_db


def test_expire_task_expires_due_orders(make_product, reserve, settings):
    make_product("TEE-M", stock=1)
    order = reserve({"TEE-M": 2}, on_shortage="ask")
    assert expire_reservations.apply().get() == 0
    Order.objects.filter(id=order.id).update(reservation_expires_at=Now() - timedelta(seconds=1))
    assert expire_reservations.apply().get() == 1
    assert Order.objects.get(id=order.id).status == "expired"


def test_expire_task_is_on_the_beat_schedule(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["orders.expire_reservations"]
    assert entry["task"] == expire_reservations.name
    assert entry["schedule"] == settings.ORDER_EXPIRY_SWEEP_SECONDS
