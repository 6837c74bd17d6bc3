"""The pool's wait for a connection is bounded by the request's deadline (core/patches/postgresql).

A request whose deadline has (almost) passed and that needs a connection
while every pooled one is taken waited the pool's whole `timeout` before:
psycopg_pool's own `ConnectionPool` (the wrong twin below) still does.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection
from psycopg_pool import ConnectionPool, PoolTimeout

from core.deadline import set_deadline
from core.patches.postgresql.base import DeadlinePool

pytestmark = pytest.mark.django_db(transaction=True)

POOL_TIMEOUT = 3.0
DEADLINE = 0.3


def _waited_for_a_connection(pool_class: type[ConnectionPool]) -> float:
    """Seconds a getconn waited, with the pool's one connection taken and a 0.3 s deadline."""
    params = {**connection.get_connection_params(), "autocommit": True}
    pool = pool_class(kwargs=params, min_size=1, max_size=1, timeout=POOL_TIMEOUT, open=True)
    try:
        held = pool.getconn()  # no deadline yet: the pool's one connection, taken
        set_deadline(DEADLINE)
        started = time.monotonic()
        with pytest.raises(PoolTimeout):
            pool.getconn()
        waited = time.monotonic() - started
        set_deadline(None)
        pool.putconn(held)
        return waited
    finally:
        set_deadline(None)
        pool.close()


def test_the_wait_for_a_pooled_connection_ends_with_the_deadline():
    assert _waited_for_a_connection(DeadlinePool) < DEADLINE + 0.5


def test_wrong_twin_psycopgs_own_pool_waits_its_whole_timeout_past_the_deadline():
    assert _waited_for_a_connection(ConnectionPool) >= POOL_TIMEOUT - 0.1


def test_without_a_deadline_the_pool_waits_its_own_timeout():
    params = {**connection.get_connection_params(), "autocommit": True}
    with DeadlinePool(kwargs=params, min_size=1, max_size=1, timeout=0.5, open=True) as pool:
        held = pool.getconn()
        started = time.monotonic()
        with pytest.raises(PoolTimeout):
            pool.getconn()
        assert time.monotonic() - started >= 0.45
        pool.putconn(held)


def test_the_shops_database_connection_comes_from_a_deadline_pool():
    if not connection.settings_dict["OPTIONS"].get("pool"):
        pytest.skip("this run's settings use no pool")
    assert isinstance(connection.pool, DeadlinePool)
