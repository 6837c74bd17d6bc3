from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.generics import GenericAPIView
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response

from core.permissions import staff_with
from idempotency.views import KeyRequest, idempotent

from .. import operations, permissions, selectors, services
from . import presenters
from .serializers import ProductIn, ProductOut, StockIn, StockOut

# Error bodies are application/problem+json (core.schema adds the generic ones).
SKU_EXISTS = OpenApiResponse(description="sku_exists")
CURRENCY_MISMATCH = OpenApiResponse(description="currency_mismatch")


class ProductListView(GenericAPIView):
    """List products; staff create them."""

    serializer_class = ProductOut

    def get_permissions(self):
        if self.request.method == "POST":
            return [IsAuthenticated(), staff_with(permissions.ADD_PRODUCT)()]
        # The catalog is public, as in any shop.
        return [AllowAny()]

    def get_queryset(self):
        return selectors.product_list()

    def paginate_queryset(self, queryset):
        # The settings' CursorPage; the stubs only know BasePagination | None.
        self.paginator.ordering = "sku"  # type: ignore[union-attr]
        return super().paginate_queryset(queryset)

    @extend_schema(responses=ProductOut(many=True))
    def get(self, request):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(ProductOut(page, many=True).data)

    @extend_schema(
        request=ProductIn, responses={201: ProductOut, 409: SKU_EXISTS, 422: CURRENCY_MISMATCH}
    )
    def post(self, request):
        data = ProductIn(data=request.data)
        data.is_valid(raise_exception=True)
        product = services.product_create(**data.validated_data)
        product = selectors.product_get(sku=product.sku)
        return Response(ProductOut(product).data, status=status.HTTP_201_CREATED)


class ProductDetailView(GenericAPIView):
    """Show one product."""

    serializer_class = ProductOut
    permission_classes = [AllowAny]

    def get(self, request, sku: str):
        return Response(ProductOut(selectors.product_get(sku=sku)).data)


class StockView(GenericAPIView):
    """Change a product's units on hand (staff, keyed): `{"delta": n}` or `{"set": n}`."""

    serializer_class = StockOut
    permission_classes = [IsAuthenticated, staff_with(permissions.ADJUST_STOCK)]

    @extend_schema(
        request=StockIn,
        responses={
            200: StockOut,
            409: OpenApiResponse(description="stock_below_reserved"),
            422: OpenApiResponse(description="stock_limit_exceeded"),
        },
    )
    @idempotent(operation=operations.STOCK_ADJUST)
    def post(self, request, sku: str, *, key: KeyRequest):
        data = StockIn(data=request.data)
        data.is_valid(raise_exception=True)
        product = selectors.product_get(sku=sku)
        operations.stock_adjust_keyed(
            run=key.claim(),
            present=presenters.stock_adjusted,
            sku=product.sku,
            **data.validated_data,
        )
