"""Test-only endpoints for the probe (mounted only when SHOP_TEST_ENDPOINTS is true)."""

from django.http import HttpResponse
from django.middleware.csrf import get_token
from django.shortcuts import get_object_or_404
from django.utils.html import format_html
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from idempotency.views import KeyRequest, form_key_field, idempotent, idempotent_form

from . import probe
from .models import ProbeRecord


class ProbeIn(serializers.Serializer):
    label = serializers.CharField(max_length=100)
    amount = serializers.IntegerField(min_value=0, max_value=1_000_000)


class ProbeView(APIView):
    """Run the probe operation under the caller's Idempotency-Key."""

    @extend_schema(exclude=True)
    @idempotent(operation=probe.OPERATION)
    def post(self, request, *, key: KeyRequest):
        data = ProbeIn(data=request.data)
        data.is_valid(raise_exception=True)
        probe.probe_run(run=key.claim(), owner_id=request.user.pk, **data.validated_data)


class ProbeUnkeyedView(APIView):
    """Run the same work without a key (the benchmark's baseline)."""

    @extend_schema(exclude=True)
    def post(self, request):
        data = ProbeIn(data=request.data)
        data.is_valid(raise_exception=True)
        record = probe.probe_run_unkeyed(owner_id=request.user.pk, **data.validated_data)
        return Response(probe.probe_body(record), status=status.HTTP_201_CREATED)


class ProbeForm(serializers.Serializer):
    label = serializers.CharField(max_length=100)
    amount = serializers.IntegerField(min_value=0)


def _form_page(request, errors=None) -> HttpResponse:
    return HttpResponse(
        format_html(
            '<!doctype html><form method="post">'
            '<input type="hidden" name="csrfmiddlewaretoken" value="{}">{}'
            '<input name="label"><input name="amount"><button>Send</button></form>{}',
            get_token(request),
            form_key_field(),
            str(errors or ""),
        ),
        status=400 if errors else 200,
    )


@idempotent_form(operation=probe.OPERATION)
def probe_form(request, *, key: KeyRequest | None):
    """Render the probe form; on POST run the probe and redirect (POST/redirect/GET)."""
    if key is None:
        return _form_page(request)
    form = ProbeForm(
        data={"label": request.POST.get("label"), "amount": request.POST.get("amount")}
    )
    if not form.is_valid():
        return _form_page(request, form.errors)
    probe.probe_run(
        run=key.claim(), owner_id=request.user.pk, answer_as="redirect", **form.validated_data
    )


def probe_page(request, probe_id):
    """Show one probe (where the form redirects)."""
    record = get_object_or_404(ProbeRecord, pk=probe_id, owner_id=request.user.pk)
    return HttpResponse(format_html("<!doctype html><p>{} {}</p>", record.label, record.status))
