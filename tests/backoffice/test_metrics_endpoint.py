"""GET /metrics: the contract's names, loopback and staff only, every process of the host."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from celery.signals import task_retry
from django.conf import settings
from django.db import transaction
from prometheus_client.parser import text_string_to_metric_families

from backoffice import metrics as endpoint
from backoffice import prometheus_multiproc
from idempotency import metrics as duplicates
from idempotency.messaging.outbox import outbox_write
from orders.services import order_hold
from tests.conftest import assert_problem
from tests.orders.conftest import ADDRESS, line_requests

pytestmark = pytest.mark.django_db

CONTRACT_NAMES = {
    "shop_duplicates_suppressed_total",
    "shop_idempotency_key_conflicts_total",
    "shop_outbox_backlog",
    "shop_outbox_oldest_age_seconds",
    "shop_task_retries_total",
    "shop_dead_letters",
    "shop_reservations_held",
    "shop_http_requests_total",
    "shop_http_request_duration_seconds",
    "shop_orders_total",
    "shop_refunds_total",
    "shop_needs_attention",
}


def scrape(client, **extra) -> dict[str, dict]:
    """GET /metrics from loopback; return {sample name: {labels tuple: value}}."""
    response = client.get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples: dict[str, dict] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        samples.setdefault(family.name, {})
        for sample in family.samples:
            key = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[key] = sample.value
    return samples


def test_every_contract_name_is_present(client):
    response = client.get("/metrics")
    text = response.content.decode()
    for name in CONTRACT_NAMES:
        assert f"# TYPE {name}" in text or f"# TYPE {name.removesuffix('_total')}" in text, name
    samples = scrape(client)
    assert samples["shop_dead_letters"][()] == 0  # no dead-letter table yet: 0, present
    for mechanism in duplicates.MECHANISMS:
        assert (("mechanism", mechanism),) in samples["shop_duplicates_suppressed_total"]


def test_database_figures(client, make_product, shopper):
    duplicates.duplicate_suppressed(mechanism=duplicates.KEY_REPLAY)
    duplicates.duplicate_suppressed(mechanism=duplicates.KEY_REPLAY)
    duplicates.duplicate_suppressed(mechanism=duplicates.KEY_REUSED, suspicious=True)
    duplicates.duplicate_suppressed(mechanism=duplicates.KEY_IN_USE)
    with transaction.atomic():
        outbox_write(aggregate_type="t", aggregate_id="1", event_type="e", payload={})
        outbox_write(aggregate_type="t", aggregate_id="2", event_type="e", payload={})
    make_product("TEE-M", stock=5)
    order_hold(
        owner=shopper,
        lines=line_requests({"TEE-M": 2}),
        on_shortage="reject",
        payment_method="pm_card_ok",
        shipping_address=ADDRESS,
    )

    samples = scrape(client)
    dupes = samples["shop_duplicates_suppressed_total"]
    assert dupes[(("mechanism", "key_replay"),)] == 2
    assert dupes[(("mechanism", "key_reused"),)] == 1
    assert samples["shop_duplicates_suspicious_total"][(("mechanism", "key_reused"),)] == 1
    conflicts = samples["shop_idempotency_key_conflicts_total"]
    assert conflicts[(("code", "idempotency_key_in_use"),)] == 1
    assert conflicts[(("code", "idempotency_key_reused"),)] == 1
    assert samples["shop_outbox_backlog"][()] == 2
    assert samples["shop_outbox_oldest_age_seconds"][()] >= 0
    assert samples["shop_reservations_held"][()] == 1
    orders = samples["shop_orders_total"]
    assert sum(orders.values()) == 1
    assert (("status", "cancelled"),) in orders  # every status, 0 when none


def test_needs_attention_is_counted_by_kind_in_the_database(client, shopper):
    from django.db.models.functions import Now

    from payments.models import PaymentSettlement
    from payments.refund_decisions import refund_record_outside
    from tests.backoffice.attention_support import every_kind, flagged_settlement

    def kinds() -> dict[str, float]:
        return {dict(k)["kind"]: v for k, v in scrape(client)["shop_needs_attention"].items()}

    assert kinds() == {"settlement": 0, "refund": 0, "step": 0, "dead_letter": 0, "report_day": 0}
    items = every_kind(shopper)
    # Not waiting: a settlement that is done, even if it was flagged once.
    PaymentSettlement.objects.filter(id=flagged_settlement(items["payment"]).id).update(
        done_at=Now()
    )
    assert kinds() == {"settlement": 1, "refund": 1, "step": 1, "dead_letter": 1, "report_day": 0}
    assert refund_record_outside(refund_id=items["refund"].id)  # staff ended it
    assert kinds()["refund"] == 0


def test_requests_are_counted_by_route_pattern_not_path(client, make_product):
    make_product("SKU-XY")
    before = scrape(client).get("shop_http_requests_total", {})
    client.get("/api/v1/products/SKU-XY/")
    client.get("/api/v1/products/NOPE/")
    client.get("/no/such/path/at/all")
    after = scrape(client)["shop_http_requests_total"]

    def delta(**labels):
        key = tuple(sorted(labels.items()))
        return after.get(key, 0) - before.get(key, 0)

    route = "/api/v1/products/<str:sku>/"
    assert delta(method="GET", status="200", route=route) == 1
    assert delta(method="GET", status="404", route=route) == 1
    assert delta(method="GET", status="404", route="unmatched") == 1
    assert not any("SKU-XY" in str(key) or "no/such" in str(key) for key in after)
    histogram = scrape(client)["shop_http_request_duration_seconds_count"]
    assert histogram[(("route", route),)] >= 2


def test_task_retries_are_counted_by_task():
    class FakeTask:
        name = "tests.flaky"

    before = _value(endpoint.registry(), "shop_task_retries_total", task="tests.flaky")
    task_retry.send(sender=FakeTask, request=None, reason="boom", einfo=None)
    after = _value(endpoint.registry(), "shop_task_retries_total", task="tests.flaky")
    assert after == before + 1


def _value(registry, name: str, **labels) -> float:
    value = registry.get_sample_value(name, labels)
    return value or 0.0


# --- access -------------------------------------------------------------------------

REMOTE = {"REMOTE_ADDR": "203.0.113.7"}


def test_remote_anonymous_is_refused(client):
    assert_problem(client.get("/metrics", **REMOTE), 403, "permission_denied")


def test_remote_shopper_is_refused(client, shopper, client_for):
    token_client = client_for(shopper)
    assert_problem(token_client.get("/metrics", **REMOTE), 403, "permission_denied")
    client.force_login(shopper)
    assert_problem(client.get("/metrics", **REMOTE), 403, "permission_denied")


def test_remote_staff_may_scrape(client, staff_client, make_user):
    assert staff_client.get("/metrics", **REMOTE).status_code == 200  # token
    client.force_login(make_user(staff=True))
    assert client.get("/metrics", **REMOTE).status_code == 200  # session (the admin)


def test_loopback_ipv6(client):
    assert client.get("/metrics", REMOTE_ADDR="::1").status_code == 200


# --- multiprocess mode ----------------------------------------------------------------

_CHILD = """
import sys
from core import instruments
instruments.HTTP_REQUESTS.labels(method="GET", status="200", route="/probe").inc(int(sys.argv[1]))
instruments.TASK_RETRIES.labels(task="t").inc()
"""


def _child(folder: Path, count: int) -> int:
    env = {**os.environ, prometheus_multiproc.ENV: str(folder)}
    process = subprocess.run(
        [sys.executable, "-c", _CHILD, str(count)],
        env=env,
        cwd=settings.BASE_DIR,
        check=True,
        capture_output=True,
    )
    return process.returncode


def test_a_scrape_sums_every_process_of_the_host(tmp_path, monkeypatch):
    """Two other processes count; this one's scrape sees both (multiprocess files)."""
    folder = prometheus_multiproc.prepare(tmp_path / "prom")
    _child(folder, 2)
    _child(folder, 3)
    monkeypatch.setenv(prometheus_multiproc.ENV, str(folder))
    registry = endpoint.registry()
    labels = {"method": "GET", "status": "200", "route": "/probe"}
    assert registry.get_sample_value("shop_http_requests_total", labels) == 5
    assert registry.get_sample_value("shop_task_retries_total", {"task": "t"}) == 2
    assert registry.get_sample_value("shop_dead_letters") == 0  # the database's figures too

    # The run command empties the folder before a run starts.
    prometheus_multiproc.prepare(folder)
    assert prometheus_multiproc.main(["x", str(folder)]) == 0
    assert endpoint.registry().get_sample_value("shop_http_requests_total", labels) is None


def test_gunicorn_hooks(tmp_path, monkeypatch):
    """gunicorn.conf.py: a private folder when unset, child_exit marks the worker dead."""
    # Recorded so that teardown removes what on_starting sets behind monkeypatch's back.
    monkeypatch.setenv(prometheus_multiproc.ENV, "placeholder")
    monkeypatch.delenv(prometheus_multiproc.ENV)
    hooks = runpy.run_path(str(Path(settings.BASE_DIR) / "gunicorn.conf.py"))
    hooks["on_starting"](None)
    folder = os.environ[prometheus_multiproc.ENV]
    assert Path(folder).is_dir()
    live = Path(folder) / "gauge_livesum_4242.db"
    live.write_bytes(b"")
    hooks["child_exit"](None, type("Worker", (), {"pid": 4242})())
    assert not live.exists()
    hooks["on_exit"](None)
    assert not Path(folder).exists()
    # A folder set by the run command is kept as it is.
    monkeypatch.setenv(prometheus_multiproc.ENV, str(tmp_path))
    hooks["on_starting"](None)
    assert os.environ[prometheus_multiproc.ENV] == str(tmp_path)


def test_a_broken_metrics_folder_never_fails_a_request(client, monkeypatch):
    from core import instruments

    def broken(**labels):
        raise FileNotFoundError("the multiprocess folder is gone")

    monkeypatch.setattr(instruments.HTTP_REQUESTS, "labels", broken)
    assert client.get("/healthz").status_code in (200, 503)
