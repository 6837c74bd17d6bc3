"""A worker judges a message's ETA by the database clock (core/patches/worker_clock.py)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from celery.contrib.testing.mocks import TaskMessage
from celery.worker.request import Request
from django.db import OperationalError

from config.celery import app
from core import db
from core.db import database_now
from core.patches import worker_clock

BEHIND = -300.0  # this host's clock 5 minutes behind the database's


def _request(request_class, *, eta: datetime | None):
    app.loader.import_default_modules()
    headers = {} if eta is None else {"eta": eta.isoformat()}
    message = TaskMessage("orders.compensation_step", args=[1], **headers)
    return request_class(message, app=app, task=app.tasks["orders.compensation_step"])


@pytest.fixture
def host_behind(monkeypatch):
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + BEHIND)
    monkeypatch.setattr(db, "_clock_offset", None)


def test_every_task_of_the_shop_gets_the_database_clock_request():
    app.loader.import_default_modules()
    shop_tasks = [t for name, t in app.tasks.items() if not name.startswith("celery.")]
    assert shop_tasks
    for task in shop_tasks:
        assert task.Request.endswith(":DatabaseClockRequest"), task.name


@pytest.mark.django_db(transaction=True)
def test_a_ring_for_later_is_due_on_a_host_behind_when_the_database_clock_says(host_behind):
    """A ring 1 s from now by the database clock, received on a host 5 minutes behind."""
    assert worker_clock.read_offset_once()  # what the consumer's reader thread does
    db_eta = datetime.fromtimestamp(database_now().timestamp() + 1.0, tz=UTC)
    host_now = time.time()
    due_in = _request(worker_clock.DatabaseClockRequest, eta=db_eta).eta.timestamp() - host_now
    assert 0.0 < due_in < 3.0
    # Wrong twin: Celery's own request, whose worker held it 5 minutes more.
    assert _request(Request, eta=db_eta).eta.timestamp() - host_now > 295


def test_before_any_read_the_eta_is_celerys(monkeypatch):
    monkeypatch.setattr(db, "_clock_offset", None)
    eta = datetime(2026, 12, 3, 1, 0, tzinfo=UTC)
    assert _request(worker_clock.DatabaseClockRequest, eta=eta).eta == eta
    assert _request(worker_clock.DatabaseClockRequest, eta=None).eta is None


def test_a_failed_read_keeps_the_last_offset(monkeypatch):
    monkeypatch.setattr(db, "_clock_offset", -300.0)

    def hung(*args, **kwargs):
        raise OperationalError("the database does not answer")

    monkeypatch.setattr(worker_clock, "database_now", hung)
    assert worker_clock.read_offset_once() is False
    assert db.clock_offset() == -300.0
