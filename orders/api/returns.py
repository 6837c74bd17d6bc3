"""Returns (contract: "Returns"): ask, read, receive.

`POST /orders/{id}/returns/` (keyed) and `POST /returns/{id}/receive/`
(staff, keyed) are one-phase keyed runs: the view validates the body (400:
nothing claimed, the key stays free), finds the object the caller may see
(404 before the claim), claims the key, and inside the phase calls the
service and stores the rendered body with its effect.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.generics import GenericAPIView
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from core.fields import ClosedSerializer, StrictCharField, StrictIntegerField
from core.permissions import IsNotCourier, owner_or_staff_with, staff_with
from idempotency.views import KeyRequest, idempotent

from .. import operations, permissions, returns, selectors
from . import presenters
from .serializers import return_body, sku_lines

PROBLEM = OpenApiResponse(description="application/problem+json")
RETURN_BODY = OpenApiResponse(description="the return body")


class ReturnLineIn(ClosedSerializer):
    sku = StrictCharField(max_length=64)
    quantity = StrictIntegerField(min_value=1, max_value=1000)


class ReturnIn(ClosedSerializer):
    # many=True makes a ListSerializer, which takes max_length; the stubs do not say so.
    lines = ReturnLineIn(many=True, allow_empty=False, max_length=100)  # type: ignore[call-arg]
    reason = StrictCharField(max_length=500, required=False, allow_blank=True, default="")

    def validate_lines(self, lines: list[dict]) -> list[returns.ReturnLineRequest]:
        return sku_lines(lines, returns.ReturnLineRequest)


class OrderReturnsView(GenericAPIView):
    """Ask to return shipped units of an order (the order's shopper, or staff)."""

    permission_classes = [
        IsAuthenticated,
        IsNotCourier,
        owner_or_staff_with(permissions.ASK_RETURN),
    ]
    serializer_class = ReturnIn

    @extend_schema(
        request=ReturnIn,
        responses={201: RETURN_BODY, 400: PROBLEM, 404: PROBLEM, 422: PROBLEM},
    )
    @idempotent(operation=operations.RETURN_CREATE)
    def post(self, request, order_id: str, *, key: KeyRequest):
        data = ReturnIn(data=request.data)
        data.is_valid(raise_exception=True)
        order = selectors.order_get_for_user(user=request.user, order_id=order_id)
        self.check_object_permissions(request, order)
        operations.return_create_keyed(
            run=key.claim(),
            present=presenters.return_created,
            order_id=order.id,
            lines=data.validated_data["lines"],
            reason=data.validated_data.get("reason", ""),
            requested_by=request.user,
        )


class ReturnDetailView(GenericAPIView):
    """One return: the order's shopper or staff; anyone else gets 404."""

    permission_classes = [IsAuthenticated, IsNotCourier]

    @extend_schema(responses={200: RETURN_BODY, 404: PROBLEM})
    def get(self, request, return_id: str):
        order_return = returns.return_get_for_user(user=request.user, return_id=return_id)
        return Response(return_body(order_return))


class ReturnReceiveView(GenericAPIView):
    """A warehouse scanner (staff) marks a return received: 202, also when already received."""

    permission_classes = [IsAuthenticated, staff_with(permissions.RECEIVE_RETURN)]

    @extend_schema(request=None, responses={202: RETURN_BODY, 403: PROBLEM, 404: PROBLEM})
    @idempotent(operation=operations.RETURN_RECEIVE)
    def post(self, request, return_id: str, *, key: KeyRequest):
        order_return = returns.return_get(return_id=return_id)
        operations.return_receive_keyed(
            run=key.claim(),
            present=presenters.return_received,
            return_id=order_return.id,
            by=request.user,
        )
