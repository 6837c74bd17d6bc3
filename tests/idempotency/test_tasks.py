"""The periodic tasks are registered, scheduled by beat and call their services."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.db.models.functions import Now

from config.celery import app
from idempotency import tasks
from idempotency.keys import body_fingerprint, key_claim
from idempotency.models import IdempotencyKey


def test_beat_schedules_completer_and_purge():
    schedule = {entry["task"]: entry for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert schedule["idempotency.complete_abandoned_keys"]["schedule"] <= 300
    assert schedule["idempotency.purge_finished_keys"]["schedule"] <= 3600
    app.loader.import_default_modules()
    assert "idempotency.complete_abandoned_keys" in app.tasks
    assert "idempotency.purge_finished_keys" in app.tasks


def test_retention_default_is_24_hours():
    assert settings.IDEMPOTENCY_KEY_RETENTION >= 24 * 3600


@pytest.mark.django_db
def test_purge_task_deletes_old_finished_keys(shopper):
    run = key_claim(
        owner_id=shopper.pk,
        key="k",
        operation="x",
        method="POST",
        path="/",
        fingerprint=body_fingerprint({}),
    )
    run.finish(status=200, body={})
    IdempotencyKey.objects.update(finished_at=Now() - timedelta(days=2))
    assert tasks.purge_finished_keys.apply().get() == 1
    assert not IdempotencyKey.objects.exists()


@pytest.mark.django_db
def test_completer_task_runs_the_service():
    assert tasks.complete_abandoned_keys.apply().get() == 0
