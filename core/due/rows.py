"""The row of due work: its columns, its policy, and the lease values every write shares."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from .timing import backoff

LAST_ERROR_MAX = 500


def truncate_error(error: object) -> str:
    """Return `error` as text that fits `last_error` (CharField(500)), keeping its start."""
    text = str(error)
    return text if len(text) <= LAST_ERROR_MAX else text[: LAST_ERROR_MAX - 1] + "…"


@dataclass(frozen=True)
class DuePolicy:
    """How one kind of due work is retried. Build it from settings at call time."""

    task: str | None  # Celery task name, called with one row id; None: no bell (sweeper only)
    max_attempts: int  # the attempt budget; then needs_attention
    backoff_base: float  # seconds after attempt 1, doubling per attempt ...
    backoff_max: float  # ... up to this
    lease: float  # seconds a leased row is not leased again (longer than the queue wait)
    # Seconds one attempt may still be running at worst (its calls' timeouts,
    # look-ups and a margin); None: `lease`. No second attempt begins before.
    attempt_lease: float | None = None

    @property
    def attempt_lease_seconds(self) -> float:
        """The attempt's lease in seconds (`attempt_lease`, else `lease`)."""
        return float(self.lease if self.attempt_lease is None else self.attempt_lease)

    def backoff(self, attempt: int) -> float:
        """Return seconds to wait after attempt `attempt` of this kind."""
        return backoff(attempt, base=self.backoff_base, cap=self.backoff_max)

    @classmethod
    def from_settings(
        cls,
        prefix: str,
        *,
        task: str | None,
        lease: float | None = None,
        attempt_lease: float | None = None,
    ) -> DuePolicy:
        """Build a kind's policy from its settings, read now (tests override them).

        `<prefix>_MAX_ATTEMPTS`, `<prefix>_BACKOFF_BASE`, `<prefix>_BACKOFF_MAX`
        and, unless `lease` is given, `<prefix>_LEASE` (e.g. `COMPENSATION`).
        """
        return cls(
            task=task,
            max_attempts=getattr(settings, f"{prefix}_MAX_ATTEMPTS"),
            backoff_base=getattr(settings, f"{prefix}_BACKOFF_BASE"),
            backoff_max=getattr(settings, f"{prefix}_BACKOFF_MAX"),
            lease=getattr(settings, f"{prefix}_LEASE") if lease is None else lease,
            attempt_lease=attempt_lease,
        )


class DueWorkQuerySet(models.QuerySet):
    def pending(self) -> DueWorkQuerySet:
        """Rows not done and not waiting for staff (due now or later)."""
        return self.filter(done_at__isnull=True, needs_attention=False)

    def due(self) -> DueWorkQuerySet:
        """Rows whose time has come by the database clock and whose lease is free."""
        return (
            self.pending()
            .filter(next_attempt_at__lte=Now())
            .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=Now()))
        )


class DueWork(models.Model):
    """A row of pending work: when it is due, how often it was tried, who holds it, why it stopped.

    Subclasses add their own columns and define `due_policy()`; they index
    due rows with `due_index(name=...)`.
    """

    # Database defaults too, so a kind may insert its rows in raw SQL
    # (`INSERT ... ON CONFLICT`) naming only the columns it cares about.
    next_attempt_at = models.DateTimeField(db_default=Now(), verbose_name=_("next attempt at"))
    attempts = models.PositiveIntegerField(default=0, db_default=0, verbose_name=_("attempts"))
    # The sweeper that enqueued the row and until when (database clock); an
    # expired lease makes the row due again.
    lease_owner = models.CharField(
        max_length=100, blank=True, default="", db_default="", verbose_name=_("lease owner")
    )
    lease_expires_at = models.DateTimeField(
        null=True, blank=True, verbose_name=_("lease expires at")
    )
    needs_attention = models.BooleanField(
        default=False, db_default=False, verbose_name=_("needs attention")
    )
    last_error = models.CharField(
        max_length=LAST_ERROR_MAX,
        blank=True,
        default="",
        db_default="",
        verbose_name=_("last error"),
    )
    done_at = models.DateTimeField(null=True, blank=True, verbose_name=_("done at"))

    objects = DueWorkQuerySet.as_manager()

    class Meta:
        abstract = True

    @classmethod
    def due_policy(cls) -> DuePolicy:
        raise NotImplementedError(f"{cls.__name__} must define due_policy()")


def due_index(*, name: str) -> models.Index:
    """Return the partial index the sweeper's lease uses: pending rows by `next_attempt_at`."""
    return models.Index(
        fields=["next_attempt_at"],
        name=name,
        condition=Q(done_at__isnull=True, needs_attention=False),
    )


def touch_values(model: type[DueWork]) -> dict[str, Any]:
    """The values that also move `updated_at` when the kind has one."""
    names = {f.name for f in model._meta.concrete_fields}
    return {"updated_at": Now()} if "updated_at" in names else {}


def free_lease_values() -> dict[str, Any]:
    """The values that free the row's lease."""
    return {"lease_owner": "", "lease_expires_at": None}


def default_owner() -> str:
    """Name this process as a lease owner (host:pid)."""
    return f"{socket.gethostname()}:{os.getpid()}"[:100]


# An attempt's lease is held in the row's lease columns, its owner being the
# attempt's fencing token; a sweeper's lease (the row enqueued) has any other owner.
ATTEMPT_OWNER_PREFIX = "attempt "


def attempt_running() -> Q:
    """An attempt's lease is held and has not run out (database clock)."""
    return Q(lease_owner__startswith=ATTEMPT_OWNER_PREFIX, lease_expires_at__gt=Now())
