"""The orders API: views parse input and call one selector or service."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response

from .. import selectors
from .serializers import OrderOut, order_body


class OrderListView(GenericAPIView):
    """List the caller's orders (staff: every order), newest first."""

    serializer_class = OrderOut

    def paginate_queryset(self, queryset):
        # Numbers are unique and increase with time: a stable cursor.
        self.paginator.ordering = "-number"
        return super().paginate_queryset(queryset)

    @extend_schema(responses=OrderOut(many=True))
    def get(self, request):
        page = self.paginate_queryset(selectors.order_list_for_user(user=request.user))
        return self.get_paginated_response([order_body(order) for order in page])


class OrderDetailView(GenericAPIView):
    """Show one order: its shopper's or, for staff, anyone's; others get 404."""

    serializer_class = OrderOut

    @extend_schema(responses=OrderOut)
    def get(self, request, order_id: str):
        order = selectors.order_get_for_user(user=request.user, order_id=order_id)
        return Response(order_body(order))
