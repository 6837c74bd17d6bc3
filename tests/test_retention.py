"""Retention: every model's rows have a documented end, and what ends them runs on a schedule.

docs/operations.md, "Retention": a table naming every model (`app_label.ModelName`)
with what removes its rows and after how long, or "kept". The guard test fails
when a model (of Django's contrib apps, of the libraries, of the shop) has no row;
the purge tests show each purge deletes old rows and keeps fresh ones, judged by
the database clock, and that beat runs it on the maintenance queue.
"""

from __future__ import annotations

import re
from datetime import timedelta
from importlib import import_module
from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings
from django.db.models.functions import Now

from config.celery import app

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "operations.md"


def retention_table(text: str | None = None) -> dict[str, list[str]]:
    """{`app_label.ModelName`: [its other cells]} from the "## Retention" section's table."""
    text = DOC.read_text() if text is None else text
    section = re.split(r"\n## ", text.split("\n## Retention\n", 1)[1], maxsplit=1)[0]
    rows = re.findall(r"^\| `(\w+\.\w+)` \|(.*)\|$", section, re.M)
    return {label: [cell.strip() for cell in cells.split("|")] for label, cells in rows}


def shop_models() -> set[str]:
    """Every model Django knows in production (contrib and libraries included, test apps not)."""
    return {
        model._meta.label
        for model in apps.get_models()
        if not model._meta.app_config.name.startswith("tests.")
    }


def test_every_model_has_a_row_in_the_retention_table():
    table = retention_table()
    missing = sorted(shop_models() - set(table))
    assert not missing, f"docs/operations.md, Retention: add a row for {missing}"
    gone = sorted(set(table) - shop_models())
    assert not gone, f"docs/operations.md, Retention: rows for models that are gone: {gone}"
    for label, cells in table.items():
        assert all(cells), f"{label}: every cell says something"


def test_the_guard_sees_a_missing_model():
    text = DOC.read_text()
    without = re.sub(r"^\| `sessions\.Session` \|.*\n", "", text, flags=re.M)
    assert "sessions.Session" in shop_models() - set(retention_table(without))


# --- the purges, by the database clock --------------------------------------------


def beat_task(name: str) -> str:
    """The task of beat's entry `name`, checked to be routed to the maintenance queue."""
    entry = settings.CELERY_BEAT_SCHEDULE[name]
    assert app.amqp.router.route({}, entry["task"])["queue"].name == "maintenance"
    assert entry["options"]["expires"] <= entry["schedule"]
    return entry["task"]


def run(task_name: str):
    app.loader.import_default_modules()
    return app.tasks[task_name].apply(throw=True).get()


@pytest.mark.django_db
def test_expired_sessions_are_cleared_on_a_schedule():
    from core.models import Session

    store = import_module(settings.SESSION_ENGINE).SessionStore
    sessions = []
    for _ in range(3):
        session = store()
        session["guest"] = "cart"
        session.create()
        sessions.append(session.session_key)
    ended, ending_now, alive = sessions
    # The database clock decides: one ended a minute ago, one ends in a second.
    Session.objects.filter(session_key=ended).update(expire_date=Now() - timedelta(minutes=1))
    Session.objects.filter(session_key=ending_now).update(expire_date=Now() + timedelta(seconds=5))

    assert run(beat_task("core.clear_expired_sessions")) == 1

    assert set(Session.objects.values_list("session_key", flat=True)) == {ending_now, alive}


@pytest.mark.django_db
def test_clear_expired_deletes_in_bounded_batches(settings):
    from core.models import Session

    store = import_module(settings.SESSION_ENGINE).SessionStore
    for _ in range(7):
        store().create()
    Session.objects.update(expire_date=Now() - timedelta(seconds=1))
    settings.SESSION_CLEAR_BATCH = 2
    settings.SESSION_CLEAR_MAX_BATCHES = 2
    assert store.clear_expired() == 4  # two batches of two, the rest for the next run
    assert Session.objects.count() == 3
    assert store.clear_expired() == 3  # the next run goes on
    assert not Session.objects.exists()


@pytest.mark.django_db
def test_the_inbox_is_purged_after_its_retention_keeping_unmatched_webhooks(settings):
    from idempotency.models import InboxMessage

    old = InboxMessage.objects.create(consumer="purchase_history", message_id="old")
    fresh = InboxMessage.objects.create(consumer="purchase_history", message_id="fresh")
    waiting = InboxMessage.objects.create(
        consumer="payments.provider", message_id="evt_1", status="unmatched"
    )
    applied = InboxMessage.objects.create(
        consumer="payments.provider", message_id="evt_2", status="applied"
    )
    retention = settings.IDEMPOTENCY_INBOX_RETENTION
    InboxMessage.objects.filter(id__in=[old.id, waiting.id, applied.id]).update(
        received_at=Now() - timedelta(seconds=retention + 60)
    )
    InboxMessage.objects.filter(id=fresh.id).update(
        received_at=Now() - timedelta(seconds=retention - 60)
    )

    assert run(beat_task("idempotency-purge-inbox")) == 2

    assert set(InboxMessage.objects.values_list("message_id", flat=True)) == {"fresh", "evt_1"}


def test_the_inbox_outlives_every_copy_it_must_refuse():
    # A copy of an outbox event arrives while its message exists (OUTBOX_RETENTION after
    # it is done) plus the redelivery window; a guest cart lives in a session.
    assert (
        settings.IDEMPOTENCY_INBOX_RETENTION
        >= settings.OUTBOX_RETENTION + settings.OUTBOX_DELIVERY_TIMEOUT
    )
    assert settings.IDEMPOTENCY_INBOX_RETENTION >= settings.SESSION_COOKIE_AGE


@pytest.mark.django_db
def test_expired_api_tokens_are_purged_on_a_schedule(make_user):
    from core.api_tokens import api_token_issue
    from core.models import ApiToken

    expired = api_token_issue(user=make_user(username="gone"))
    fresh = api_token_issue(user=make_user(username="here"))
    lifetime = settings.API_TOKEN_LIFETIME
    ApiToken.objects.filter(user__username="gone").update(
        created=Now() - timedelta(seconds=lifetime + 1)
    )
    ApiToken.objects.filter(user__username="here").update(
        created=Now() - timedelta(seconds=lifetime - 60)
    )
    assert expired.key != fresh.key

    assert run(beat_task("shop.purge_api_tokens")) == 1

    assert list(ApiToken.objects.values_list("user__username", flat=True)) == ["here"]
