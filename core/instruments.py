"""Per-process Prometheus instruments: HTTP requests, Celery task retries, the outbox lag.

prometheus_client keeps these in the process; with `PROMETHEUS_MULTIPROC_DIR`
set (the run command and gunicorn.conf.py set it, see docs/operations.md)
every process writes its values to files in that folder and `/metrics` sums
the files of every web and worker process of the host. The variable must be
set before the process first imports prometheus_client.

The business and duplicate figures are not here: they are read from the
database at scrape time (backoffice/metrics.py), so they cover the whole
deployment, not one host.
"""

from __future__ import annotations

import contextvars

import prometheus_client
from celery.signals import task_postrun, task_prerun, task_retry
from prometheus_client import Counter, Histogram

# `_created` series are not written in multiprocess mode; leave them out
# everywhere so a scrape looks the same with one process or many.
prometheus_client.disable_created_metrics()

HTTP_REQUESTS = Counter(
    "shop_http_requests",
    "HTTP requests answered, by method, status and route pattern (never the raw path).",
    ["method", "status", "route"],
)
HTTP_DURATION = Histogram(
    "shop_http_request_duration_seconds",
    "Time from the request reaching Django to its answer, by route pattern.",
    ["route"],
)
TASK_RETRIES = Counter(
    "shop_task_retries",
    "Celery task retries (Task.retry), by task name.",
    ["task"],
)
# Observed by the consumer's process once its effect committed: outbox row created ->
# delivery done, both read from the database clock (idempotency.messaging.deliveries).
OUTBOX_LAG = Histogram(
    "shop_outbox_lag_seconds",
    "Time from an outbox message's creation to a consumer's effect committed, per consumer.",
    ["consumer"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0),
)

# Methods outside this set are counted as "other" (bounded label values).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _count_retry(sender=None, **_kwargs) -> None:
    name = getattr(sender, "name", None) or "unknown"
    TASK_RETRIES.labels(task=name).inc()


task_retry.connect(_count_retry, weak=False, dispatch_uid="shop.task_retries")


# --- Celery: the log context of a task ------------------------------------------

_task_tokens: dict[str, contextvars.Token] = {}


def _task_started(task_id=None, task=None, **_kwargs) -> None:
    from .logging import bind

    _task_tokens[task_id] = bind(task=getattr(task, "name", None), task_id=task_id)


def _task_ended(task_id=None, **_kwargs) -> None:
    from .logging import reset

    token = _task_tokens.pop(task_id, None)
    if token is not None:
        try:
            reset(token)
        except ValueError:  # bound in another context (eager calls nested in a request)
            pass


task_prerun.connect(_task_started, weak=False, dispatch_uid="shop.log_context.task_prerun")
task_postrun.connect(_task_ended, weak=False, dispatch_uid="shop.log_context.task_postrun")
