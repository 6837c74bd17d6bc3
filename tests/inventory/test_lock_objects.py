import pytest
from django.db import transaction

from inventory import lock_objects
from inventory.models import StockItem
from inventory.services import reservations_hold
from tests.concurrency import Workers, wait_for_lock_waiters


@pytest.mark.django_db(transaction=True)
def test_stock_rows_are_locked_in_primary_key_order_whatever_the_request_order(make_product):
    """Two holds over the same items in opposite orders both queue on the lowest row.

    Were rows locked in request order, the [B, A] hold would own B while
    waiting for A, and the [A, B] hold, once given A, would wait for B: a
    deadlock. Here B must still be free while both wait.
    """
    make_product("A", stock=5)
    make_product("B", stock=5)
    a = StockItem.objects.get(product__sku="A")
    b = StockItem.objects.get(product__sku="B")
    assert a.id < b.id

    workers = Workers()
    with transaction.atomic():
        lock_objects.stock_items_lock(stock_ids=[a.id])
        workers.start(reservations_hold, requests={b.id: 1, a.id: 1}, partial=False)
        workers.start(reservations_hold, requests={a.id: 1, b.id: 1}, partial=False)
        wait_for_lock_waiters(2)
        # Nobody holds B: it can be locked without waiting.
        assert list(
            StockItem.objects.filter(id=b.id).select_for_update(nowait=True).values_list("id")
        ) == [(b.id,)]
    results = workers.join()

    assert all(set(held) == {a.id, b.id} for held in results)
    assert [s.reserved for s in StockItem.objects.order_by("id")] == [2, 2]


@pytest.mark.django_db
def test_lock_returns_current_counters(make_product):
    make_product("A", stock=5)
    stock = StockItem.objects.get()
    with transaction.atomic():
        assert lock_objects.stock_items_lock(stock_ids=[stock.id, stock.id]) == {stock.id: (5, 0)}
        assert lock_objects.stock_items_lock(stock_ids=[]) == {}
