"""A web request's deadline: no wait on the database outlives it.

Every other wait of a web request has its own bound: a pooled connection
(`DB_POOL_TIMEOUT`), a new connection (`DB_CONNECT_TIMEOUT`), a ring of the
broker (`BROKER_SOCKET_TIMEOUT`, the publish confirm timeout), the cache's
socket timeout, the provider (`PAYMENTS_PROVIDER_TIMEOUT`); `bounded()`
shortens the pool's, the publish's and the provider's to what is left of
the deadline, so none of them starts a full wait after it has passed. A statement on
a database that accepted it and then stopped answering has none: the
server's `statement_timeout` does not run on a stopped server, and a
partitioned link whose packets are still acknowledged (a proxy, a stopped
peer's kernel) never trips `tcp_user_timeout`. Such a request would hold
its thread for as long as the fault lasts, with no answer at all
(docs/failure-model.md, "What broke, and what fixed it").

`RequestDeadlineMiddleware` gives each web request `WEB_REQUEST_TIMEOUT`
seconds from the moment it joined the queue for a thread (the web server
says when: core/patches/gunicorn_worker.py; else from the middleware), by
this process's monotonic clock: a duration measured where it is spent, never
a decision shared with another host. `DeadlineConnection`
(core/patches/psycopg_connection.py), the pool's connection class, bounds
every wait of psycopg on the socket (a statement, a commit, the pool's
health check of a connection it hands out) by what is left of it. When it
passes, the connection is closed (its protocol state is unknown
mid-statement, so it is never used again) and the wait raises
`OperationalError`, which every request turns into 503
`service_unavailable` with `Retry-After` (core/problems.py): the request's
transaction did not commit, and the same request again, with the same
Idempotency-Key, finishes it.

Outside a web request (Celery tasks, commands) there is no deadline: a task
is bounded by its time limit and its lease.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.signals import request_finished

if TYPE_CHECKING:  # the settings import this module: no django.http at import time
    from django.http import HttpRequest, HttpResponse

_local = threading.local()


def current_deadline() -> float | None:
    """This thread's deadline (time.monotonic()), or None outside a web request."""
    return getattr(_local, "deadline", None)


def set_deadline(seconds: float | None, *, since: float | None = None) -> None:
    """Give this thread `seconds` from `since` (a time.monotonic(); default now).
    None or 0 seconds: no deadline."""
    start = time.monotonic() if since is None else since
    _local.deadline = start + seconds if seconds else None


def request_queued(at: float) -> None:
    """Called by the web server (core/patches/gunicorn_worker.py) in the thread that is about
    to run a request: when the request joined the queue for a thread. Its deadline
    counts from there, so time spent waiting for a thread is inside it."""
    _local.queued_at = at


# The least a call bounded by a passed deadline still gets: a zero or negative
# timeout means "no timeout" to some clients (requests, sockets).
BOUNDED_FLOOR = 0.01


def bounded(timeout: float) -> float:
    """Return `timeout` (seconds), or what is left of this thread's deadline if that is less.

    For waits that are not on a database socket and have their own bound: a
    connection from the pool (core/patches/postgresql), a publish
    (core/patches/celery_publish.py), the payment provider (payments/gateway).
    Outside a web request: `timeout`.
    """
    deadline = current_deadline()
    if deadline is None:
        return timeout
    return max(min(timeout, deadline - time.monotonic()), BOUNDED_FLOOR)


def _end_deadline(**kwargs: object) -> None:
    set_deadline(None)


# Django returns a request's connection to the pool on request_finished, after the
# response: that return (a rollback, when one is needed) is still the request's, so
# the deadline ends after it. Django's own receiver was connected first.
request_finished.connect(_end_deadline, dispatch_uid="core.deadline.end")


SERVER_TIMING_HEADER = "Server-Timing"


class RequestDeadlineMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        since, _local.queued_at = getattr(_local, "queued_at", None), None
        since = time.monotonic() if since is None else since
        set_deadline(settings.WEB_REQUEST_TIMEOUT, since=since)
        response = self.get_response(request)
        # How long this answer took here, counted as the deadline counts (from the
        # queue for a thread): what a client sees beyond it was spent before the
        # server took the request (its own process, the network, the kernel's
        # accept queue). The chaos run judges hung requests by it (tools/chaos/faults.py).
        response[SERVER_TIMING_HEADER] = f"app;dur={(time.monotonic() - since) * 1000:.1f}"
        if getattr(response, "streaming", False):
            # A streamed answer (the admin's CSV exports read a server-side cursor
            # chunk by chunk) may rightly take longer than one deadline in all:
            # each chunk gets a whole one, so no single wait outlives it.
            response.streaming_content = _renewing(response.streaming_content)  # type: ignore[attr-defined]
        return response


def _renewing(chunks: Iterable[bytes]) -> Iterator[bytes]:
    iterator = iter(chunks)
    while True:
        set_deadline(settings.WEB_REQUEST_TIMEOUT)  # before the reads of the next chunk
        try:
            chunk = next(iterator)
        except StopIteration:
            return
        yield chunk
