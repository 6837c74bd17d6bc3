"""Provider keys: derived from the operation's identity, never random.

A key is `<install id>:<reference>:<kind>`, e.g. `3f9c0d2a51b7e468:order-42:capture`
or `...:refund-<return id>:refund`. Every retry, every process and every
settlement attempt derives the same key for the same operation, so the
provider's own idempotency turns any number of sends into one money movement.
"""

from __future__ import annotations

import uuid

from django.db.models import Subquery

from .models import PaymentInstallation


def install_id() -> str:
    """Return this installation's id, creating the singleton row on first use.

    Insert first (`ON CONFLICT DO NOTHING`), then read: concurrent first
    calls all end up with the one committed row.
    """
    PaymentInstallation.objects.bulk_create(
        [PaymentInstallation(id=1, install_id=uuid.uuid4().hex[:16])], ignore_conflicts=True
    )
    return PaymentInstallation.objects.values_list("install_id", flat=True).get(id=1)


def install_id_subquery() -> Subquery:
    """Return the install id as a subquery, to read in the same statement as another row.

    It is NULL until `install_id()` first created the row (then call that).
    """
    return Subquery(PaymentInstallation.objects.filter(id=1).values("install_id")[:1])


def provider_key(*, install: str, reference: str, kind: str) -> str:
    """Derive the provider key of one operation."""
    return f"{install}:{reference}:{kind}"
