"""Shipments and courier tracking events (contract: "Shipments and courier tracking events").

`POST /orders/{id}/shipments/` (staff, keyed) is a one-phase keyed run: the
view validates the body (400: nothing claimed), claims the key, and inside
the run's one phase calls `orders.shipments.shipment_create` and stores the
rendered body with the shipment; a refusal raised there (409, 422) is
stored as the key's answer. Tracking events are stored raw by
`orders.tracking` and read only through its deduplicating selector.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, datetime

from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import (
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import serializers
from rest_framework.generics import GenericAPIView
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from core.errors import InvalidRequest
from core.fields import ClosedSerializer, StrictCharField, StrictIntegerField
from core.pagination import CursorPage
from core.permissions import IsCourierOrStaff, IsNotCourier, staff_with
from idempotency.views import KeyRequest, idempotent

from .. import operations, permissions, selectors, shipments, tracking
from ..states import TrackingStatus
from . import presenters
from .serializers import ShipmentOut, sku_lines

PROBLEM = OpenApiResponse(description="application/problem+json")


# --- Shipments ---------------------------------------------------------------


class ShipmentLineIn(ClosedSerializer):
    sku = StrictCharField(max_length=64)
    quantity = StrictIntegerField(min_value=1, max_value=1000)


class ShipmentIn(ClosedSerializer):
    """POST /orders/{id}/shipments/ body; every member optional (no lines: ship everything)."""

    # many=True makes a ListSerializer, which takes max_length; the stubs do not say so.
    lines = ShipmentLineIn(  # type: ignore[call-arg]
        many=True, required=False, allow_empty=False, max_length=100
    )
    carrier = StrictCharField(max_length=64, required=False, allow_null=True, allow_blank=True)
    tracking_number = StrictCharField(
        max_length=128, required=False, allow_null=True, allow_blank=True
    )

    def validate_lines(self, lines: list[dict]) -> list[shipments.ShipmentLineRequest]:
        return sku_lines(lines, shipments.ShipmentLineRequest)


class ShipmentCreateView(GenericAPIView):
    """Ship confirmed units of an order (staff, keyed)."""

    serializer_class = ShipmentOut
    permission_classes = [IsAuthenticated, staff_with(permissions.SHIP)]

    @extend_schema(
        request=ShipmentIn,
        responses={201: ShipmentOut, 400: PROBLEM, 404: PROBLEM, 409: PROBLEM, 422: PROBLEM},
    )
    @idempotent(operation=operations.SHIPMENT_CREATE)
    def post(self, request, order_id: str, *, key: KeyRequest):
        data = ShipmentIn(data=request.data)
        data.is_valid(raise_exception=True)
        order = selectors.order_get_for_user(user=request.user, order_id=order_id)
        operations.shipment_create_keyed(
            run=key.claim(),
            present=presenters.shipment_created,
            order_id=order.id,
            lines=data.validated_data.get("lines"),
            carrier=data.validated_data.get("carrier"),
            tracking_number=data.validated_data.get("tracking_number"),
        )


# --- Tracking events -----------------------------------------------------------


def _has_nul(value) -> bool:
    """Whether a NUL character is in any string (member names included) of a JSON value."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(item) for item in value)
    return False


@extend_schema_field({"type": "string", "format": "date-time", "maxLength": 64})
class RFC3339Field(StrictCharField):
    """An RFC 3339 time with a UTC offset, parsed by the serializer."""


class TrackingEventIn(serializers.Serializer):
    """A courier's event. Members beyond these are kept in the stored payload, not refused."""

    event_id = StrictCharField(max_length=200)
    status = serializers.ChoiceField(choices=TrackingStatus.choices)
    occurred_at = RFC3339Field(max_length=64)
    # Optional: an event without one is stored with no location (not a 500).
    location = StrictCharField(max_length=200, default=None, allow_null=True, allow_blank=True)

    def to_internal_value(self, data):
        # The payload is kept whole (jsonb): PostgreSQL cannot store a NUL in it.
        if _has_nul(data):
            raise serializers.ValidationError(
                {"non_field_errors": ["Null characters are not allowed."]}
            )
        return super().to_internal_value(data)

    def validate_occurred_at(self, value: str) -> datetime:
        try:
            parsed = parse_datetime(value)
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            # Stored in UTC: PostgreSQL refuses offsets past 15:59 that RFC 3339 allows.
            try:
                return parsed.astimezone(UTC)
            except OverflowError:  # 0001-01-01T00:00+01:00 is before year 1 in UTC
                pass
        raise serializers.ValidationError(
            "An RFC 3339 time with a UTC offset, e.g. 2026-05-01T12:00:00Z."
        )


class TrackingEventOut(serializers.Serializer):
    event_id = serializers.CharField()
    status = serializers.CharField()
    occurred_at = serializers.DateTimeField()
    location = serializers.CharField(allow_null=True)
    received_at = serializers.DateTimeField()


class TrackingCursor:
    """Keyset cursor over the deduplicated list: the last (occurred_at, id) of the page.

    A position, not an offset: duplicates arriving between two pages, or new
    events, never shift what the next page starts with.
    """

    param = "cursor"

    @staticmethod
    def encode(event) -> str:
        raw = json.dumps([event.occurred_at.isoformat(), event.id]).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @staticmethod
    def decode(value: str | None) -> tuple[datetime, int] | None:
        if value is None:
            return None
        try:
            raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
            occurred, event_pk = json.loads(raw)
            parsed = datetime.fromisoformat(occurred)
            if not isinstance(event_pk, int) or isinstance(event_pk, bool) or parsed.tzinfo is None:
                raise ValueError(value)
        except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
            raise InvalidRequest(
                "The cursor is invalid.", errors={"cursor": ["Invalid cursor."]}
            ) from None
        return parsed, event_pk


TrackingListOut = inline_serializer(
    name="TrackingEventList",
    fields={
        "results": TrackingEventOut(many=True),
        "next": serializers.URLField(allow_null=True),
        "duplicates_received": serializers.IntegerField(),
    },
)


class TrackingEventsView(GenericAPIView):
    """Post a tracking event (courier or staff); list them deduplicated (shopper or staff)."""

    serializer_class = TrackingEventOut

    def get_permissions(self):
        if self.request.method == "POST":
            return [IsAuthenticated(), IsCourierOrStaff(permissions.POST_TRACKING_EVENT)]
        # Couriers only post: reading is the order's shopper's or staff's.
        return [IsAuthenticated(), IsNotCourier()]

    @extend_schema(
        request=TrackingEventIn,
        responses={202: OpenApiResponse(description="accepted"), 400: PROBLEM, 403: PROBLEM},
    )
    def post(self, request, shipment_id: str):
        raw_body = request.body.decode("utf-8", errors="replace")
        payload = request.data
        data = TrackingEventIn(data=payload)
        data.is_valid(raise_exception=True)
        shipment = selectors.shipment_get(shipment_id=shipment_id)
        tracking.tracking_event_record(
            shipment=shipment,
            payload=dict(payload),
            raw_body=raw_body,
            received_by=request.user,
            **data.validated_data,
        )
        return Response(
            {"shipment_id": str(shipment.id), "event_id": data.validated_data["event_id"]},
            status=202,
        )

    @extend_schema(responses={200: TrackingListOut, 404: PROBLEM})
    def get(self, request, shipment_id: str):
        shipment = selectors.shipment_get_for_user(user=request.user, shipment_id=shipment_id)
        page_size = CursorPage().get_page_size(request)
        after = TrackingCursor.decode(request.query_params.get(TrackingCursor.param))
        events = tracking.tracking_events_after(
            shipment_id=shipment.id, after=after, limit=page_size + 1
        )
        next_link = None
        if len(events) > page_size:
            events = events[:page_size]
            cursor = TrackingCursor.encode(events[-1])
            next_link = replace_query_param(
                request.build_absolute_uri(), TrackingCursor.param, cursor
            )
        summary = tracking.tracking_summary(shipment_id=shipment.id)
        return Response(
            {
                "results": TrackingEventOut(events, many=True).data,
                "next": next_link,
                "duplicates_received": summary.duplicates_received,
            }
        )
