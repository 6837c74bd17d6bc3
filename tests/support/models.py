"""Test-only tables: the probe's rows, and a minimal kind of due work."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models.functions import Now

from core.due import DuePolicy, DueWork, due_index


class ProbeRecord(models.Model):
    """A row written by the test-only probe operation (`tests.support.probe`); no business data.

    Deliberately without a unique constraint per key: the fencing token alone
    must keep a stalled request from committing a second record.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    label = models.CharField(max_length=100)
    amount = models.PositiveIntegerField()
    status = models.CharField(max_length=20)
    confirmation = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return f"probe {self.label} ({self.status})"


class DueChore(DueWork):
    """A minimal kind of due work for the generic tests of `core.due` (tests/core/test_due.py)."""

    label = models.CharField(max_length=100)

    class Meta:
        indexes = [due_index(name="testsupport_duechore_due_idx")]

    def __str__(self) -> str:
        return f"chore {self.label} (attempt {self.attempts})"

    @classmethod
    def due_policy(cls) -> DuePolicy:
        return DuePolicy(
            task="testsupport.work_chore",
            max_attempts=3,
            backoff_base=10.0,
            backoff_max=60.0,
            lease=30.0,
            attempt_lease=20.0,
        )
