from django.contrib.auth import authenticate
from django.core.validators import RegexValidator
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.generics import GenericAPIView
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from core.fields import ClosedSerializer, StrictCharField
from core.money import format_money, shop_currency
from core.permissions import IsNotCourier

from .. import history, loyalty, services
from .throttles import RegisterThrottle, TokenAddressThrottle, TokenUsernameThrottle

TokenOut = inline_serializer("TokenOut", {"token": serializers.CharField()})


class StrictEmailField(StrictCharField, serializers.EmailField):
    """An email address sent as a JSON string."""


class RegisterIn(ClosedSerializer):
    username = StrictCharField(
        max_length=150,
        validators=[RegexValidator(r"^[\w.@+-]+$", "Letters, digits and @ . + - _ only.")],
    )
    email = StrictEmailField()
    password = StrictCharField(max_length=128, trim_whitespace=False)


class TokenIn(ClosedSerializer):
    username = StrictCharField(max_length=150)
    password = StrictCharField(max_length=128, trim_whitespace=False)


class RegisterView(APIView):
    """Register a shopper account and return its API token."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [RegisterThrottle]

    @extend_schema(
        request=RegisterIn,
        responses={201: TokenOut, 409: OpenApiResponse(description="username_taken")},
    )
    def post(self, request):
        data = RegisterIn(data=request.data)
        data.is_valid(raise_exception=True)
        _, token = services.user_register(**data.validated_data)
        return Response({"token": token.key}, status=status.HTTP_201_CREATED)


class TokenView(APIView):
    """Exchange a username and password for a new API token (each log-in its own).

    The token expires after API_TOKEN_LIFETIME and is revoked when the password
    changes or the account is deleted (401 `not_authenticated`).
    """

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [TokenUsernameThrottle, TokenAddressThrottle]

    @extend_schema(request=TokenIn, responses={200: TokenOut})
    def post(self, request):
        data = TokenIn(data=request.data)
        data.is_valid(raise_exception=True)
        user = authenticate(request._request, **data.validated_data)
        token = services.token_obtain(user=user)
        return Response({"token": token.key})


class AccountView(APIView):
    """Delete (anonymise) the caller's own account; orders and payments stay. Not a courier's."""

    permission_classes = [IsAuthenticated, IsNotCourier]

    @extend_schema(request=None, responses={204: None})
    def delete(self, request):
        services.user_anonymise(user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


LoyaltyOut = inline_serializer(
    "LoyaltyOut", {"balance": serializers.IntegerField(), "version": serializers.IntegerField()}
)


class LoyaltyView(APIView):
    """Read the caller's own points balance and its version (0 and 0 before the first event)."""

    permission_classes = [IsAuthenticated]

    @extend_schema(responses={200: LoyaltyOut})
    def get(self, request):
        balance, version = loyalty.loyalty_get(user=request.user)
        return Response({"balance": balance, "version": version})


class PurchaseHistoryOut(serializers.Serializer):
    order_number = serializers.IntegerField()
    sku = serializers.CharField()
    quantity = serializers.IntegerField()
    amount = serializers.CharField()
    currency = serializers.CharField()


def _history_body(line) -> dict:
    currency = line.currency or shop_currency()
    return {
        "order_number": line.order_number,
        "sku": line.sku,
        "quantity": line.quantity,
        "amount": format_money(line.amount, currency),
        "currency": currency,
    }


class PurchaseHistoryView(GenericAPIView):
    """List the caller's own purchases, net of returns and cancellations, newest order first."""

    permission_classes = [IsAuthenticated]
    serializer_class = PurchaseHistoryOut

    def paginate_queryset(self, queryset):
        # (order number, position, sku) is unique: a stable cursor.
        # The settings' CursorPage; the stubs only know BasePagination | None.
        self.paginator.ordering = ("-order_number", "position", "sku")  # type: ignore[union-attr]
        return super().paginate_queryset(queryset)

    @extend_schema(responses=PurchaseHistoryOut(many=True))
    def get(self, request):
        page = self.paginate_queryset(history.history_for_user(user=request.user))
        return self.get_paginated_response([_history_body(line) for line in page])
