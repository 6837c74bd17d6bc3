"""Refunds of an order (contract: "Refunds").

`POST /orders/{id}/refunds/` (staff, keyed) is a one-phase keyed run: the
body is validated strictly first (400/422: nothing claimed, nothing
reserved, nothing sent), then the key is claimed and the run's one phase
mints the refund id, reserves the amount (payments.refunds.refund_request)
and stores the answer with them. `GET` lists the order's refunds, whatever
started them (goodwill, a return, a cancellation), for its shopper or staff.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.generics import GenericAPIView
from rest_framework.permissions import IsAuthenticated

from core.permissions import IsNotCourier, staff_with
from idempotency.views import KeyRequest, idempotent
from payments import selectors as payment_selectors

from .. import operations, permissions, selectors
from . import presenters
from .serializers import RefundIn, RefundOut, refund_body

PROBLEM = OpenApiResponse(description="application/problem+json")


class RefundsView(GenericAPIView):
    """Refund an order's payment (staff, keyed); list the order's refunds (shopper or staff)."""

    serializer_class = RefundOut

    def get_permissions(self):
        if self.request.method == "POST":
            return [IsAuthenticated(), staff_with(permissions.REFUND)()]
        return [IsAuthenticated(), IsNotCourier()]

    def paginate_queryset(self, queryset):
        # Refund ids are random: order by creation time, then id (a stable cursor).
        # The settings' CursorPage; the stubs only know BasePagination | None.
        self.paginator.ordering = ("created_at", "id")  # type: ignore[union-attr]
        return super().paginate_queryset(queryset)

    @extend_schema(responses={200: RefundOut(many=True), 404: PROBLEM})
    def get(self, request, order_id: str):
        order = selectors.order_get_for_user(user=request.user, order_id=order_id)
        page = self.paginate_queryset(
            payment_selectors.refunds_of_payment(payment_id=order.payment_id)
        )
        return self.get_paginated_response([refund_body(r, order_id=order.id) for r in page])

    @extend_schema(
        request=RefundIn,
        responses={201: RefundOut, 400: PROBLEM, 404: PROBLEM, 409: PROBLEM, 422: PROBLEM},
    )
    @idempotent(operation=operations.REFUND_CREATE)
    def post(self, request, order_id: str, *, key: KeyRequest):
        data = RefundIn(data=request.data)
        data.is_valid(raise_exception=True)
        order = selectors.order_get_for_user(user=request.user, order_id=order_id)
        operations.refund_create_keyed(
            run=key.claim(),
            present=presenters.refund_created,
            order_id=order.id,
            amount=data.validated_data["amount"],
            reason=data.validated_data["reason"],
            requested_by=request.user,
        )
