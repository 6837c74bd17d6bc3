"""orders.lock_objects: the order read in the statement that locks its payment."""

import psycopg
import pytest
from django.db import connection, transaction

from orders.lock_objects import order_read_payment_lock
from orders.services import order_payment_start

pytestmark = pytest.mark.django_db(transaction=True)


def _payment_is_locked(payment_id) -> bool:
    """Ask from a connection of its own whether the payment row can be locked right now."""
    params = connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as other:
        try:
            other.execute(
                "SELECT 1 FROM payments_payment WHERE id = %s FOR UPDATE NOWAIT", [payment_id]
            )
        except psycopg.errors.LockNotAvailable:
            return True
    return False


def test_the_payment_is_locked_and_the_order_is_not(make_product, reserve):
    make_product("TEE-M", price="19.99", stock=5)
    with transaction.atomic():
        order = order_payment_start(order=reserve({"TEE-M": 1}))

    with transaction.atomic():
        read = order_read_payment_lock(order_id=order.id)
        assert read.id == order.id and read.payment.id == order.payment_id
        assert _payment_is_locked(order.payment_id)
        params = connection.get_connection_params()
        with psycopg.connect(**params, autocommit=True) as other:
            # Payment first, then order: the order row stays free for who locks it next.
            other.execute("SELECT 1 FROM orders_order WHERE id = %s FOR UPDATE NOWAIT", [order.id])
    assert not _payment_is_locked(order.payment_id)


def test_an_order_without_a_payment_is_read_alone(make_product, reserve):
    make_product("TEE-M", price="19.99", stock=5)
    order = reserve({"TEE-M": 1})

    with transaction.atomic():
        read = order_read_payment_lock(order_id=order.id)

    assert read.id == order.id and read.payment_id is None
