"""gunicorn's threaded worker with the health checks answered ahead of the request queue.

Upstream: gunicorn 27.0.1. Replaces `gunicorn.workers.gthread.ThreadWorker.enqueue_req`;
copies the deferral branch of `ThreadWorker.finish_request` (a connection
waiting on the poller, brought back by `on_pending_socket_readable`); relies
on `ThreadWorker.handle` skipping its wait for first bytes when
`TConn.data_ready` is set, and on `TConn`'s attributes (`parser`,
`initialized`, `data_ready`, `timeout`).

gunicorn's gthread worker hands every connection to one pool of `--threads`
threads; what does not find a free thread waits in the pool's queue. When a
dependency hangs (a partitioned or stopped database), every thread soon holds
a request waiting on it, for up to the pool's timeout or the connection's
TCP bound, and a `/healthz` that arrives then waits behind them, past the
2 s in which the contract wants its answer ("never a request hanging on a
pool"; docs/failure-model.md, "What broke, and what fixed it").

This worker looks at the first bytes of each request before it picks a pool:
`GET /healthz` and `GET /livez` (and their HEAD) go to a pool of their own,
HEALTH_THREADS threads that nothing else uses, so they are answered while
every request thread is held. Everything else goes where gthread sends it.
A new connection whose bytes have not arrived yet waits on the worker's
poller (as gthread's own deferred connections do), not in a thread.

It also stamps each request with the moment it joined a pool's queue: the
request's deadline (core/deadline.py) counts from there, so a request that
waited for a thread has that much less left.

The health views bound themselves (backoffice/health.py: every check ends by its
deadline), so two threads are enough; more health requests than that wait
for each other, never for a shopper's request.

gunicorn.conf.py makes this the worker class of every gunicorn started from
the checkout; a command line's `--worker-class` still wins (the tests'
sync servers, the bench).
"""

from __future__ import annotations

import selectors
import socket
import time
from concurrent import futures
from functools import partial

from gunicorn.workers.gthread import DEFAULT_WORKER_DATA_TIMEOUT, TConn, ThreadWorker

HEALTH_THREADS = 2
# A request line starts with one of these (a query string or a space follows
# the path): the health views only, whose answers depend on nothing that can hang.
HEALTH_REQUESTS = tuple(
    f"{method} {path}{end}".encode()
    for method in ("GET", "HEAD")
    for path in ("/healthz", "/livez")
    for end in (" ", "?")
)
_PEEK = max(map(len, HEALTH_REQUESTS))


def is_health_request(head: bytes) -> bool:
    """Whether a connection's first bytes are a request for a health view."""
    return head.startswith(HEALTH_REQUESTS)


class HealthFirstWorker(ThreadWorker):
    def init_process(self) -> None:
        self.health_pool = futures.ThreadPoolExecutor(
            max_workers=HEALTH_THREADS, thread_name_prefix="health"
        )
        super().init_process()

    def _peek(self, conn: TConn) -> bytes | None:
        """The connection's next bytes, unread; None when none have arrived yet."""
        try:
            return conn.sock.recv(_PEEK, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None
        except OSError:
            return b""  # the thread's read meets the error and closes the connection

    def enqueue_req(self, conn: TConn) -> None:
        pool = self.tpool
        # Bytes gunicorn already read ahead are the next request: the socket's
        # are not, so such a connection goes where gthread sends it.
        read_ahead = conn.parser is not None and conn.parser.unreader.buf.getvalue()
        if not read_ahead and not self.cfg.is_ssl:
            head = self._peek(conn)
            if head is None and not conn.initialized and not conn.data_ready:
                self._wait_for_first_bytes(conn)
                return
            if head is not None:
                conn.data_ready = True  # the thread need not wait for them
            if head and is_health_request(head):
                pool = self.health_pool
        conn.queued_at = time.monotonic()  # the request's deadline counts from here
        fs = pool.submit(self.handle, conn)
        fs.add_done_callback(lambda fut: self.method_queue.defer(self.finish_request, conn, fut))

    def _wait_for_first_bytes(self, conn: TConn) -> None:
        """A new connection with nothing to read yet waits on the poller, as one
        gthread deferred does; `on_pending_socket_readable` brings it back here.
        It gets the time gthread gives a new connection's first bytes in all
        (a thread's wait, then the keep-alive timeout on the poller)."""
        conn.timeout = time.monotonic() + DEFAULT_WORKER_DATA_TIMEOUT + self.cfg.keepalive
        self.pending_conns.append(conn)
        self.poller.register(
            conn.sock, selectors.EVENT_READ, partial(self.on_pending_socket_readable, conn)
        )

    def handle_request(self, req: object, conn: TConn) -> bool:
        # In the thread that runs it, before the application sees it (core/deadline.py).
        from core.deadline import request_queued

        request_queued(getattr(conn, "queued_at", time.monotonic()))
        return bool(super().handle_request(req, conn))

    def handle_quit(self, sig: int, frame: object) -> None:
        self.health_pool.shutdown(wait=False)
        super().handle_quit(sig, frame)

    def run(self) -> None:
        try:
            super().run()
        finally:
            self.health_pool.shutdown(wait=False)
