"""`POST /api/v1/payments/webhooks/`: the provider's signed events (payments.webhooks).

Unauthenticated (the signature is the authentication) and CSRF-exempt (no
session authentication runs). The view reads the RAW body: the signature
covers exactly those bytes, so DRF's parsers never see it.
"""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from core.problems import problem_response

from .. import webhooks

PROBLEM = OpenApiResponse(description="application/problem+json")


class WebhookEventDataIn(serializers.Serializer):
    provider_key = serializers.CharField()
    reference = serializers.CharField()
    amount = serializers.CharField(help_text="Decimal string, e.g. `19.99`.")
    currency = serializers.CharField(min_length=3, max_length=3)
    operation_id = serializers.CharField(required=False)


class WebhookEventIn(serializers.Serializer):
    id = serializers.CharField(max_length=255)
    type = serializers.ChoiceField(choices=sorted(webhooks.EVENT_TYPES))
    created = serializers.IntegerField(help_text="Unix seconds.")
    # The metaclass moves declared fields off the class, so `.data` stays the property.
    data = WebhookEventDataIn()  # type: ignore[assignment]


class WebhookAckOut(serializers.Serializer):
    received = serializers.BooleanField()
    id = serializers.CharField()
    status = serializers.ChoiceField(
        choices=[
            webhooks.APPLIED,
            webhooks.NO_EFFECT,
            webhooks.UNMATCHED,
            webhooks.IGNORED,
            webhooks.SUSPICIOUS,
            webhooks.DUPLICATE,
        ]
    )


class WebhookView(APIView):
    """Receive one provider event: verify its signature, store it once, apply it once."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(
        operation_id="payments_webhook_receive",
        request=WebhookEventIn,
        parameters=[
            OpenApiParameter(
                name=webhooks.SIGNATURE_HEADER,
                location=OpenApiParameter.HEADER,
                required=True,
                type=str,
                description='`t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">` '
                "with the shared webhook secret; older than 300 s by the database clock → 400 "
                "`invalid_signature`.",
            )
        ],
        responses={200: WebhookAckOut, 400: PROBLEM, 413: PROBLEM},
        auth=[],
        tags=["payments"],
    )
    def post(self, request):
        body = request.body  # raises RequestDataTooBig (413) above DATA_UPLOAD_MAX_MEMORY_SIZE
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and len(body) > limit:  # a chunked body has no Content-Length
            return problem_response(
                status=413,
                code="payload_too_large",
                detail=f"The request body is larger than {limit} bytes.",
            )
        outcome = webhooks.webhook_receive(
            body=body, signature=request.headers.get(webhooks.SIGNATURE_HEADER)
        )
        return Response({"received": True, "id": outcome.event_id, "status": outcome.status})
