"""Courier tracking events: stored raw, deduplicated on read. The ONLY module using the raw rows.

Couriers deliver events at least once (their retries, our timeouts), so the
same `event_id` arrives several times, sometimes at the same instant. The
write path stores every arrival exactly as received, with no uniqueness
check (a unique constraint would turn a courier's harmless retry into an
error they retry again, and would drop the evidence of what was sent).
Every reader (API, admin, reports) goes through `tracking_events`, which
keeps each `event_id` once, the first received (lowest id) winning, in
`occurred_at` order. A test fails if any other production module touches
`TrackingEvent`'s manager.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Q, QuerySet, Subquery

from idempotency import metrics

from .models import Shipment, TrackingEvent


def tracking_event_record(
    *,
    shipment: Shipment,
    event_id: str,
    status: str,
    occurred_at: datetime,
    location: str | None,
    payload: dict,
    raw_body: str,
    received_by=None,
) -> TrackingEvent:
    """Store one received tracking event as it came, duplicates included (no uniqueness check).

    A repeat of an `event_id` already stored for the shipment is counted as a
    duplicate the read path will suppress (`on_read_dedup`), and as suspicious
    when its payload differs from the first one's. The count is monitoring
    only: two copies arriving in the same instant may not see each other.
    """
    event = TrackingEvent.objects.create(
        shipment=shipment,
        event_id=event_id,
        status=status,
        occurred_at=occurred_at,
        location=location,
        payload=payload,
        raw_body=raw_body,
        received_by=received_by,
    )
    first = (
        _raw(shipment_id=shipment.id)
        .filter(event_id=event_id, id__lt=event.id)
        .order_by("id")
        .values_list("payload", flat=True)
        .first()
    )
    if first is not None:
        metrics.duplicate_suppressed(
            mechanism=metrics.ON_READ_DEDUP,
            suspicious=first != payload,
            shipment_id=str(shipment.id),
            event_id=event_id,
        )
    return event


def tracking_events_record_many(*, shipment: Shipment, payloads: Iterable[dict]) -> int:
    """Store many received events at once, as `tracking_event_record` would (seeding, imports).

    Each payload is an already validated event object (`occurred_at` an RFC
    3339 string); duplicates are stored like any other. Return how many.
    """
    rows = (
        TrackingEvent(
            shipment=shipment,
            event_id=payload["event_id"],
            status=payload["status"],
            occurred_at=datetime.fromisoformat(payload["occurred_at"]),
            location=payload.get("location"),
            payload=payload,
            raw_body=json.dumps(payload),
        )
        for payload in payloads
    )
    return len(TrackingEvent.objects.bulk_create(rows, batch_size=1000))


def _raw(*, shipment_id) -> QuerySet[TrackingEvent]:
    return TrackingEvent.objects.filter(shipment_id=shipment_id)


def tracking_events(*, shipment_id) -> QuerySet[TrackingEvent]:
    """Return a shipment's tracking events, each `event_id` once, in `occurred_at` order.

    The first received row of an `event_id` (lowest id) wins. PostgreSQL's
    `DISTINCT ON (event_id)` needs `ORDER BY event_id, id` first, so it picks
    the winners' ids in a subquery and the outer query orders them by
    (`occurred_at`, `id`): a total, stable order for cursor pagination.
    """
    winners = (
        _raw(shipment_id=shipment_id).order_by("event_id", "id").distinct("event_id").values("id")
    )
    return TrackingEvent.objects.filter(id__in=Subquery(winners)).order_by("occurred_at", "id")


def tracking_events_after(*, shipment_id, after: tuple[datetime, int] | None, limit: int):
    """Return up to `limit` deduplicated events strictly after the (occurred_at, id) position."""
    events = tracking_events(shipment_id=shipment_id)
    if after is not None:
        occurred_at, event_pk = after
        events = events.filter(
            Q(occurred_at__gt=occurred_at) | Q(occurred_at=occurred_at, id__gt=event_pk)
        )
    return list(events[:limit])


@dataclass(frozen=True)
class TrackingSummary:
    """What the raw rows of one shipment hold beyond the deduplicated list."""

    received: int  # raw rows
    distinct: int  # event ids (= deduplicated events)
    suspicious: int  # event ids received with more than one distinct payload

    @property
    def duplicates_received(self) -> int:
        return self.received - self.distinct


def tracking_summary(*, shipment_id) -> TrackingSummary:
    """Count a shipment's raw rows, distinct event ids and suspicious event ids (two queries).

    A duplicate with a *different* payload (same `event_id`, another status,
    time or place) is suspicious: a courier bug or a reused id. The first
    received still wins; the count lets staff see it (the admin shows it).
    """
    totals = _raw(shipment_id=shipment_id).aggregate(
        received=Count("id"), distinct=Count("event_id", distinct=True)
    )
    suspicious = (
        _raw(shipment_id=shipment_id)
        .values("event_id")
        .annotate(payloads=Count("payload", distinct=True))
        .filter(payloads__gt=1)
        .count()
    )
    return TrackingSummary(
        received=totals["received"], distinct=totals["distinct"], suspicious=suspicious
    )
