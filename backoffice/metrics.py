"""`GET /metrics`: Prometheus text for every process of this host plus the database's figures.

Two sources (docs/operations.md):

- per-process instruments (core.instruments: HTTP requests and their
  duration, Celery task retries). With `PROMETHEUS_MULTIPROC_DIR` set, the
  files of every web and worker process of the host are summed; without it
  only this process answers for itself (tests, a lone `runserver`).
- the database, queried at scrape time: duplicate and key-conflict counts
  (idempotency.metrics), the outbox backlog, dead letters, reservations held,
  orders and refunds by status, items needing attention by kind. These
  cover the whole deployment.

Open to loopback clients (the host's own Prometheus or agent) and staff
(session or `Authorization: Token`); anyone else gets 403 problem+json.
"""

from __future__ import annotations

import ipaddress
import os

from django.http import HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector

import core.instruments  # noqa: F401 - defines the per-process instruments
from core.problems import problem_response
from idempotency import metrics as duplicates
from idempotency.messaging.deliveries import dead_letters_count
from idempotency.selectors import outbox_backlog
from inventory.selectors import reservations_held
from orders.selectors import orders_by_status
from payments.selectors import refunds_by_status

from .needs_attention import needs_attention_counts

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


# --- The database's figures (each read by the app that owns the rows) -------------


def dead_letters() -> int:
    """Deliveries given up on (dead letters, waiting for staff to requeue them)."""
    return dead_letters_count()


class DatabaseCollector:
    """Read the database's figures at scrape time (a few indexed aggregates)."""

    def collect(self):
        dupes = CounterMetricFamily(
            "shop_duplicates_suppressed",
            "Duplicates suppressed, by mechanism (database: every process of the deployment).",
            labels=["mechanism"],
        )
        for mechanism, value in duplicates.duplicate_totals().items():
            dupes.add_metric([mechanism], value)
        yield dupes

        suspicious = CounterMetricFamily(
            "shop_duplicates_suspicious",
            "Suppressed duplicates whose payload differed from the first one under the same id.",
            labels=["mechanism"],
        )
        for mechanism, value in duplicates.suspicious_totals().items():
            suspicious.add_metric([mechanism], value)
        yield suspicious

        conflicts = CounterMetricFamily(
            "shop_idempotency_key_conflicts",
            "Keyed requests refused: 409 idempotency_key_in_use, 422 idempotency_key_reused.",
            labels=["code"],
        )
        for code, value in duplicates.conflict_totals().items():
            conflicts.add_metric([code], value)
        yield conflicts

        backlog, oldest = outbox_backlog()
        yield GaugeMetricFamily("shop_outbox_backlog", "Outbox rows not yet published.", backlog)
        yield GaugeMetricFamily(
            "shop_outbox_oldest_age_seconds",
            "Age of the oldest unpublished outbox row (0 when none).",
            oldest,
        )
        yield GaugeMetricFamily(
            "shop_dead_letters", "Messages given up on (dead letters).", dead_letters()
        )
        yield GaugeMetricFamily(
            "shop_reservations_held", "Reservation flags currently held.", reservations_held()
        )
        orders = GaugeMetricFamily(
            "shop_orders_total", "Orders currently in each status.", labels=["status"]
        )
        for status, value in orders_by_status().items():
            orders.add_metric([status], value)
        yield orders
        refunds = GaugeMetricFamily(
            "shop_refunds_total", "Refunds currently in each status.", labels=["status"]
        )
        for status, value in refunds_by_status().items():
            refunds.add_metric([status], value)
        yield refunds
        attention = GaugeMetricFamily(
            "shop_needs_attention",
            "Items waiting for a person (the admin's Needs attention page), by kind.",
            labels=["kind"],
        )
        for kind, value in needs_attention_counts().items():
            attention.add_metric([kind], value)
        yield attention


class _ThisProcess:
    """The per-process instruments when there is no multiprocess folder."""

    def collect(self):
        return REGISTRY.collect()


def registry() -> CollectorRegistry:
    """Build the registry of one scrape: the host's processes and the database."""
    scrape = CollectorRegistry(auto_describe=False)
    if os.environ.get(MULTIPROC_ENV):
        MultiProcessCollector(scrape)
    else:
        scrape.register(_ThisProcess())
    scrape.register(DatabaseCollector())
    return scrape


# --- Access ---------------------------------------------------------------------


def _loopback(request) -> bool:
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False


def _staff(request) -> bool:
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return bool(user.is_staff and user.is_active)
    if request.headers.get("Authorization", "").startswith("Token "):
        from rest_framework.exceptions import AuthenticationFailed
        from rest_framework.request import Request

        from core.authentication import ExpiringTokenAuthentication

        try:
            found = ExpiringTokenAuthentication().authenticate(Request(request))
        except AuthenticationFailed:
            return False
        return bool(found and found[0].is_staff and found[0].is_active)
    return False


@require_GET
def metrics_view(request):
    """Answer the Prometheus scrape (loopback or staff), else 403 problem+json."""
    if not (_loopback(request) or _staff(request)):
        return problem_response(
            status=403,
            code="permission_denied",
            detail="Metrics are open to loopback clients and staff.",
        )
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(registry()), content_type=content_type)
