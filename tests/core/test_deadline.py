"""A web request's deadline bounds its waits on the database (core/deadline.py).

A partitioned link whose packets are still acknowledged (a fault proxy
dropping everything, as the chaos run's partitions do) holds a statement
for as long as the fault lasts: psycopg's own connection waits for ever
(the wrong twin below), the shop's `DeadlineConnection` gives up at the
thread's deadline and closes the connection.
"""

from __future__ import annotations

import contextlib
import threading
import time

import psycopg
import pytest
import requests
from django.db import connection

from core.deadline import current_deadline, set_deadline
from core.patches.psycopg_connection import DeadlineConnection
from tests.support.servers import web_behind_db_proxy
from tools.chaos.faultproxy import FaultProxy

pytestmark = pytest.mark.django_db(transaction=True)


def _proxied_dsn(proxy_port: int) -> str:
    params = connection.get_connection_params()
    host = params.get("host") or "127.0.0.1"
    if str(host).startswith("/"):
        pytest.skip("the database answers on a Unix socket: no TCP for the fault proxy")
    return psycopg.conninfo.make_conninfo(
        dbname=params["dbname"],
        user=params.get("user") or "",
        password=params.get("password") or "",
        host="127.0.0.1",
        port=proxy_port,
    )


@pytest.fixture
def proxy():
    params = connection.get_connection_params()
    proxy = FaultProxy(
        target=(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
    ).start()
    yield proxy
    proxy.heal()
    proxy.stop()


def _hangs(conn_class: type[psycopg.Connection], dsn: str, proxy: FaultProxy) -> dict:
    """Run SELECT 1 over a link that goes dark, with a 1 s deadline; what happened."""
    outcome: dict = {}

    def body() -> None:
        set_deadline(1.0)
        try:
            with conn_class.connect(dsn, autocommit=True) as conn:
                conn.execute("SELECT 1")  # the link works
                proxy.drop()
                started = time.monotonic()
                try:
                    conn.execute("SELECT 1")
                    outcome["result"] = "answered"
                except psycopg.OperationalError as exc:
                    outcome["result"] = type(exc).__name__
                outcome["took"] = time.monotonic() - started
                outcome["closed"] = conn.closed
        finally:
            set_deadline(None)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(4.0)
    outcome["still_waiting"] = thread.is_alive()
    proxy.heal()  # lets a waiting statement finish
    thread.join(10)
    return outcome


def test_a_statement_on_a_dark_link_ends_at_the_deadline_and_closes_the_connection(proxy):
    outcome = _hangs(DeadlineConnection, _proxied_dsn(proxy.port), proxy)
    assert outcome["still_waiting"] is False
    assert outcome["result"] == "DeadlineExceeded"
    assert outcome["took"] < 2.0
    assert outcome["closed"] is True  # its protocol state is unknown: never used again


def test_wrong_twin_psycopgs_own_connection_waits_for_as_long_as_the_link_is_dark(proxy):
    outcome = _hangs(psycopg.Connection, _proxied_dsn(proxy.port), proxy)
    assert outcome["still_waiting"] is True  # 4 s with a 1 s deadline: nothing bounds it
    assert outcome["result"] == "answered"  # ... until the link heals


def test_no_deadline_outside_a_web_request():
    """Celery tasks and commands: a thread that never entered a request has none."""
    seen: list = []
    thread = threading.Thread(target=lambda: seen.append(current_deadline()))
    thread.start()
    thread.join()
    assert seen == [None]


@contextlib.contextmanager
def _a_dark_database_after_one_answer(tmp_path, deadline: str):
    """The run command's gunicorn (1 worker, 2 threads) with WEB_REQUEST_TIMEOUT=`deadline`:
    one request answered, then the database link dropped; yields (url, proxy)."""
    with web_behind_db_proxy(
        tmp_path, workers=1, threads=2, WEB_REQUEST_TIMEOUT=deadline, DB_POOL_TIMEOUT="2"
    ) as (url, proxy):
        assert requests.get(f"{url}/api/v1/products/", timeout=10).status_code == 200
        proxy.drop()
        yield url, proxy


@pytest.mark.tcp_servers  # the fault proxy needs a TCP PostgreSQL
@pytest.mark.serial  # a bound of a second or two on the answer
def test_a_web_request_on_a_partitioned_database_answers_503_by_its_deadline(tmp_path):
    """WEB_REQUEST_TIMEOUT=3: a request that needs the database answers 503 within the
    deadline plus 2 s, and the next one after the heal answers 200 (the connection the
    deadline closed is not handed out again). The pool's wait is shorter than the
    deadline, as the defaults are (10 s, 20 s): the pool's health check of the
    connection it hands out is what hangs."""
    with _a_dark_database_after_one_answer(tmp_path, "3") as (url, proxy):
        started = time.monotonic()
        response = requests.get(f"{url}/api/v1/products/", timeout=15)
        took = time.monotonic() - started
        assert response.status_code == 503, response.text
        assert response.headers["Content-Type"] == "application/problem+json"
        assert response.json()["code"] == "service_unavailable"
        assert took < 3 + 2, f"answered after {took:.1f} s"
        proxy.heal()
        assert requests.get(f"{url}/api/v1/products/", timeout=10).status_code == 200


@pytest.mark.tcp_servers  # the fault proxy needs a TCP PostgreSQL
@pytest.mark.serial  # a bound of a second or two on the answer
def test_wrong_twin_without_a_deadline_the_request_waits_as_long_as_the_partition(tmp_path):
    with _a_dark_database_after_one_answer(tmp_path, "0") as (url, _proxy):
        with pytest.raises(requests.Timeout):
            requests.get(f"{url}/api/v1/products/", timeout=8)


@pytest.mark.tcp_servers  # the fault proxy needs a TCP PostgreSQL
@pytest.mark.serial  # a bound of a second or two on the answer
@pytest.mark.parametrize(
    "argv_tail, within",
    [
        pytest.param((), True, id="shipped-worker-class"),
        # The wrong twin: gunicorn's own gthread says nothing of the queue, so the
        # deadline counts from the middleware and the second request gets a whole one.
        pytest.param(("--worker-class", "gthread"), False, id="gthread-wrong-twin"),
    ],
)
def test_a_request_that_waited_for_a_thread_has_that_much_less_time(tmp_path, argv_tail, within):
    """One thread: the second request waits behind the first for the first's whole
    deadline, and answers right after it, not a whole deadline later (the web
    server stamps when a request joined the queue: core/patches/gunicorn_worker.py)."""
    with web_behind_db_proxy(
        tmp_path, argv_tail, workers=1, threads=1, WEB_REQUEST_TIMEOUT="3", DB_POOL_TIMEOUT="2"
    ) as (url, proxy):
        assert requests.get(f"{url}/api/v1/products/", timeout=10).status_code == 200
        proxy.drop()
        took: dict[str, float] = {}
        statuses: dict[str, int] = {}

        def get(name: str) -> None:
            started = time.monotonic()
            statuses[name] = requests.get(f"{url}/api/v1/products/", timeout=15).status_code
            took[name] = time.monotonic() - started

        first = threading.Thread(target=get, args=("first",))
        first.start()
        time.sleep(0.3)  # the first holds the only thread
        get("second")
        first.join()
        assert statuses == {"first": 503, "second": 503}
        # Within: it ends with the first's deadline (~3 s). The twin waits that long for the
        # thread, then its own bounded wait for a connection (DB_POOL_TIMEOUT, 2 s): ~4.7 s.
        assert (took["second"] < 3 + 1) is within, took


@pytest.mark.parametrize(
    "options, let_go",
    [
        pytest.param("-c client_connection_check_interval=1000", True, id="shipped-setting"),
        # The wrong twin: PostgreSQL's default (0, no check) keeps waiting for the lock.
        pytest.param("", False, id="no-check-wrong-twin"),
    ],
)
def test_a_connection_the_deadline_closed_stops_waiting_for_its_lock_on_the_server(options, let_go):
    """The deadline closes the client's side; the server's backend, waiting for a
    lock, notices its client is gone within DB_CLIENT_CHECK_INTERVAL and ends (its
    own locks with it) instead of waiting until it gets the lock or lock_timeout."""
    from django.conf import settings

    assert (
        "client_connection_check_interval=1000"
        in settings.DATABASES["default"]["OPTIONS"]["options"]
    )
    params = connection.get_connection_params()
    dsn = psycopg.conninfo.make_conninfo(
        dbname=params["dbname"],
        user=params.get("user") or "",
        password=params.get("password") or "",
        host=str(params.get("host") or ""),
        port=params.get("port") or "",
    )
    with psycopg.connect(dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(424242)")
        waiter = DeadlineConnection.connect(dsn, autocommit=True, options=options)
        pid = waiter.info.backend_pid
        set_deadline(1.0)
        try:
            with pytest.raises(psycopg.OperationalError):
                waiter.execute("SELECT pg_advisory_lock(424242)")
        finally:
            set_deadline(None)
        assert waiter.closed
        gone_by = time.monotonic() + 3.0
        while time.monotonic() < gone_by:
            alive = holder.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]
            ).fetchone()[0]
            if not alive:
                break
            time.sleep(0.1)
        holder.execute("SELECT pg_advisory_unlock(424242)")
    assert (not alive) is let_go


def test_a_streamed_answer_gives_each_chunk_a_whole_deadline(settings):
    """The admin's CSV exports stream a server-side cursor: the export as a whole may
    take longer than one deadline, each chunk's reads may not."""
    from django.http import HttpResponse, StreamingHttpResponse
    from django.test import RequestFactory

    from core.deadline import RequestDeadlineMiddleware

    settings.WEB_REQUEST_TIMEOUT = 0.5
    left: list[float] = []

    def chunks():
        for _ in range(4):
            left.append(current_deadline() - time.monotonic())
            time.sleep(0.3)  # four chunks: 1.2 s in all, more than one deadline
            yield b"x"

    try:
        middleware = RequestDeadlineMiddleware(lambda request: StreamingHttpResponse(chunks()))
        response = middleware(RequestFactory().get("/admin/orders/order/export/"))
        assert b"".join(response.streaming_content) == b"xxxx"
        assert len(left) == 4 and min(left) > 0.3, left  # each chunk started with ~0.5 s left

        plain = RequestDeadlineMiddleware(lambda request: HttpResponse(b"ok"))
        before = time.monotonic()
        plain(RequestFactory().get("/"))
        assert 0.4 < current_deadline() - before < 0.55  # until request_finished ends it
    finally:
        set_deadline(None)  # no request_finished here: the test's own teardown needs none


def test_bounded_gives_what_is_left_of_the_deadline_and_never_zero():
    from core.deadline import BOUNDED_FLOOR, bounded

    assert bounded(5.0) == 5.0  # no deadline: the call's own bound
    set_deadline(1.0)
    try:
        assert 0.5 < bounded(5.0) <= 1.0
        assert bounded(0.2) == 0.2  # the call's own bound comes first when shorter
        set_deadline(1.0, since=time.monotonic() - 2.0)  # passed a second ago
        assert bounded(5.0) == BOUNDED_FLOOR  # never 0: "no timeout" to some clients
    finally:
        set_deadline(None)


def test_server_timing_counts_the_answer_from_when_the_request_joined_the_queue(settings):
    """The answer says how long it took here, counted as its deadline counts: a
    request that waited 1.5 s for a thread says so (the chaos run judges hung
    requests by it, tools/chaos/faults.py::hung_requests)."""
    from django.http import HttpResponse
    from django.test import RequestFactory

    from core.deadline import RequestDeadlineMiddleware, request_queued

    settings.WEB_REQUEST_TIMEOUT = 20
    middleware = RequestDeadlineMiddleware(lambda request: HttpResponse(b"ok"))
    try:
        request_queued(time.monotonic() - 1.5)
        queued = middleware(RequestFactory().get("/"))
        fresh = middleware(RequestFactory().get("/"))  # no stamp: counted from the middleware
    finally:
        set_deadline(None)
    name, _, dur = queued["Server-Timing"].partition(";dur=")
    assert name == "app" and 1500 <= float(dur) < 2500, queued["Server-Timing"]
    assert float(fresh["Server-Timing"].partition(";dur=")[2]) < 500
