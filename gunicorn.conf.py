"""gunicorn's settings for the shop; gunicorn reads `./gunicorn.conf.py` by itself.

Every gunicorn started from the checkout (the run command's `web`, the
tests' servers, a deployment run from here) loads this file, so command-line
options keep their meaning and only what must hold everywhere lives here.

What is here: a worker dies with its master (the end of this file), and
gunicorn's own error answers are problem+json, like
every other error of the shop (docs/errors.md). gunicorn refuses some
requests before Django sees them (a request line longer than
`limit_request_line`: 414; a header longer than `limit_request_field_size`
or more than `limit_request_fields` headers: 431; a malformed request: 400)
and writes an HTML page for them through `gunicorn.util.write_error`, which
has no setting or hook; replacing that function is the only way to change
the page. It is looked up at call time by every worker class.
"""

import json
import os
import signal
import sys

from gunicorn import util

# Threads, with /healthz and /livez answered by threads of their own ahead of
# the request queue (core/patches/gunicorn_worker.py): a host whose request threads
# all wait on a hung database still says 503 within 2 s. `--threads` sets the
# request threads; a command line's `--worker-class` still wins.
worker_class = "core.patches.gunicorn_worker.HealthFirstWorker"

# gunicorn's defaults, stated because the limits are part of what clients see.
limit_request_line = 4094
limit_request_fields = 100
limit_request_field_size = 8190

# The problem `type` base; the same variable and default as the settings'
# PROBLEM_TYPE_BASE (this file cannot import Django settings: it runs in
# gunicorn's master before any application is loaded).
_TYPE_BASE = os.environ.get("PROBLEM_TYPE_BASE", "https://shop.example/problems/")

_CODES = {
    400: "invalid_request",
    403: "permission_denied",
    414: "uri_too_long",
    417: "expectation_failed",
    431: "header_fields_too_large",
    500: "internal_error",
    501: "not_implemented",
}


def _write_problem(sock, status_int, reason, mesg):
    """Answer gunicorn's own refusal of a request as application/problem+json."""
    code = _CODES.get(status_int, "internal_error" if status_int >= 500 else "invalid_request")
    body = json.dumps(
        {
            "type": _TYPE_BASE + code.replace("_", "-"),
            "title": reason,
            "status": status_int,
            "code": code,
            # gunicorn's message for a 500 is empty: the details are in its log.
            "detail": mesg or f"{reason}.",
        }
    ).encode()
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\n"
        "Connection: close\r\n"
        "Content-Type: application/problem+json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode("latin-1")
    util.write_nonblock(sock, head + body)


util.write_error = _write_problem


# --- Prometheus multiprocess mode (docs/operations.md) -------------------------
# Every worker writes its request metrics to files in PROMETHEUS_MULTIPROC_DIR
# and /metrics sums them. The run command sets (and empties) the folder for
# web and Celery alike; without it gunicorn makes a private one for its workers.
# The variable must be set before a worker imports prometheus_client: workers
# load the application after the fork (no --preload), so on_starting is early
# enough.
_own_metrics_dir = None


def on_starting(server):
    global _own_metrics_dir
    from backoffice import prometheus_multiproc

    _own_metrics_dir = prometheus_multiproc.ensure_env()


def child_exit(server, worker):
    from backoffice import prometheus_multiproc

    prometheus_multiproc.process_dead(worker.pid)


def on_exit(server):
    from backoffice import prometheus_multiproc

    prometheus_multiproc.remove(_own_metrics_dir)


# --- The cyclic garbage collector in a worker -------------------------------------
# (docs/runs/bench.md, "the gunicorn worker's RSS rise", has the measurements.)
# Almost everything a request builds is held in reference cycles (a DRF
# serializer and its bound fields point at each other, so do the view, its
# request and the response's context), hundreds of objects per keyed checkout
# that only the cycle collector frees. Whatever of them is still alive when a
# young collection runs is promoted, and CPython collects the oldest
# generation only once what was promoted there since the last full collection
# exceeds 25 % of what survived it, the loaded application included. So a
# worker carries a thousand or more checkouts' worth of dead objects between
# full collections, and its RSS rises by that much before levelling off.
# Freezing what the loaded application holds moves it out of the collector's
# reach (it lives as long as the worker anyway), so the 25 % is counted
# against what the requests themselves left long-lived: full collections come
# several times as often, and each scans only what was made after the freeze.
def post_worker_init(worker):
    import gc

    gc.collect()
    gc.freeze()
    gc.collect()


# --- A worker dies with its master ----------------------------------------------
# A master SIGKILLed (its supervisor killed: runner/supervisor.py gives the
# master SIGKILL as its parent-death signal) leaves its workers to notice
# within a second, finish their requests in flight for up to the graceful
# timeout and exit only when every thread has, so a request waiting on a hung
# database would keep an orphaned worker running (docs/running.md, "Nothing
# left running"). A worker gets SIGKILL when its master dies; its
# requests are cut as a SIGKILLed host's are, and every one is built for that.
# A graceful stop is unchanged: the master outlives its workers.
_PR_SET_PDEATHSIG = 1


def post_fork(server, worker):
    if not sys.platform.startswith("linux") or os.environ.get("SHOP_NO_PDEATHSIG") == "1":
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != server.pid:  # the master died before the signal was asked for
        os._exit(1)
