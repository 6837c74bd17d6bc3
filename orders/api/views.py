"""The orders API: views parse input and call one selector or service."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.generics import GenericAPIView
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from core.permissions import IsNotCourier, owner_or_staff_with
from core.serializers import validated
from idempotency.views import KeyRequest, idempotent

from .. import operations, permissions, selectors
from . import presenters
from .serializers import OrderIn, OrderOut, order_body

PROBLEM = OpenApiResponse(description="application/problem+json")
# Placing only (docs/checkout.md, "Limits per shopper"); a replay is never throttled.
ORDER_THROTTLED = OpenApiResponse(
    description="throttled (with Retry-After): the shopper placed ORDER_PLACE_PER_MINUTE "
    "orders in the last minute or holds ORDER_HOLDING_MAX orders awaiting a decision or a "
    "payment outcome; nothing is held or stored, the same key may be sent again later"
)
# Shoppers and staff; a courier gets 403 (it may only post tracking events).
ORDER_PERMISSIONS = [IsAuthenticated, IsNotCourier]


class OrderListView(GenericAPIView):
    """List the caller's orders (staff: every order), newest first; place an order."""

    serializer_class = OrderOut
    permission_classes = ORDER_PERMISSIONS

    def paginate_queryset(self, queryset):
        # Numbers are unique and increase with time: a stable cursor.
        # The settings' CursorPage; the stubs only know BasePagination | None.
        self.paginator.ordering = "-number"  # type: ignore[union-attr]
        return super().paginate_queryset(queryset)

    @extend_schema(responses=OrderOut(many=True))
    def get(self, request):
        page = self.paginate_queryset(selectors.order_keys_for_user(user=request.user))
        orders = selectors.orders_in_page(keys=page)
        return self.get_paginated_response([order_body(order) for order in orders])

    @extend_schema(
        request=OrderIn,
        responses={
            201: OrderOut,
            202: OrderOut,
            400: PROBLEM,
            402: PROBLEM,
            409: PROBLEM,
            422: PROBLEM,
            429: ORDER_THROTTLED,
        },
    )
    @idempotent(operation=operations.CREATE)
    def post(self, request, *, key: KeyRequest):
        data = validated(OrderIn, request.data)
        operations.order_place_keyed(
            run=key.claim(), present=presenters.order_created, user=request.user, **data
        )


class OrderDetailView(GenericAPIView):
    """Show one order: its shopper's or, for staff, anyone's; others get 404."""

    serializer_class = OrderOut
    permission_classes = ORDER_PERMISSIONS

    @extend_schema(responses=OrderOut)
    def get(self, request, order_id: str):
        order = selectors.order_get_for_user(user=request.user, order_id=order_id)
        return Response(order_body(order))


class OrderConfirmView(GenericAPIView):
    """Say yes to an `awaiting_decision` order: charge what is reserved."""

    serializer_class = OrderOut
    permission_classes = ORDER_PERMISSIONS

    @extend_schema(
        request=None,
        responses={
            200: OrderOut,
            202: OrderOut,
            402: PROBLEM,
            403: PROBLEM,
            404: PROBLEM,
            409: PROBLEM,
        },
    )
    @idempotent(operation=operations.CONFIRM)
    def post(self, request, order_id: str, *, key: KeyRequest):
        # Confirming charges the shopper's payment method: their decision, not staff's.
        order = selectors.order_get_for_owner_decision(user=request.user, order_id=order_id)
        operations.order_confirm_keyed(
            run=key.claim(), present=presenters.order_confirmed, order_id=order.id
        )


class OrderCancelView(GenericAPIView):
    """Cancel an order: its shopper's own, or staff holding `orders.change_order`."""

    serializer_class = OrderOut
    permission_classes = [*ORDER_PERMISSIONS, owner_or_staff_with(permissions.CANCEL)]

    @extend_schema(
        request=None, responses={200: OrderOut, 202: OrderOut, 404: PROBLEM, 409: PROBLEM}
    )
    @idempotent(operation=operations.CANCEL)
    def post(self, request, order_id: str, *, key: KeyRequest):
        order = selectors.order_get_for_user(user=request.user, order_id=order_id)
        self.check_object_permissions(request, order)
        operations.order_cancel_keyed(
            run=key.claim(), present=presenters.order_cancelled, order_id=order.id
        )
