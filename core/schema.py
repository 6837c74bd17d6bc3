"""The OpenAPI schema's error answers: every 4xx an operation can give, as problem+json.

Views declare their domain answers (`@extend_schema(responses={409: ...})`);
this AutoSchema adds the generic ones the contract promises on every endpoint
("Errors", "Idempotency keys"), so a client (or a fuzzer) reading
`/api/schema/` finds every status it can get documented, each error as an
`application/problem+json` body with `type`, `title`, `status` and `code`:

- 400 `invalid_request` / `malformed_json`: any body, query or key to check;
- 401 `not_authenticated`: any view that authenticates (a bad token is 401
  even where anonymous callers are allowed);
- 403 `permission_denied`: any view with a permission beyond AllowAny, and
  unsafe methods under session authentication (CSRF);
- 404 `not_found`: any path with a parameter;
- 409 `idempotency_key_in_use` / 422 `idempotency_key_reused`: keyed endpoints;
- 413 `payload_too_large` / 415 `unsupported_media_type`: any request body;
- 429 `throttled`: throttled views.

Request bodies say what the serializers refuse: a `ClosedSerializer` is
`additionalProperties: false` (unknown members are a 400), a nested list
with `allow_empty=False` / `max_length` has `minItems` / `maxItems`, and a
serializer's `openapi_extra` (e.g. `minProperties`) is merged in.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import is_list_serializer
from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import AllowAny

from .fields import ClosedSerializer

PROBLEM_CONTENT_TYPE = "application/problem+json"
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"

GENERIC_DESCRIPTIONS = {
    "400": "invalid_request (with errors: {field: [messages]}) or malformed_json",
    "401": "not_authenticated",
    "403": "permission_denied",
    "404": "not_found",
    "409": "conflict (keyed: idempotency_key_in_use, with Retry-After)",
    "413": "payload_too_large",
    "415": "unsupported_media_type",
    "422": "unprocessable (keyed: idempotency_key_reused)",
    "429": "throttled (with Retry-After)",
}


class ProblemSerializer(serializers.Serializer):
    """An RFC 9457 problem document; an error may add members (`order_id`, ...)."""

    type = serializers.CharField(help_text="A URI naming the problem.")
    title = serializers.CharField()
    status = serializers.IntegerField(help_text="The HTTP status code.")
    code = serializers.CharField(help_text="Stable snake_case string clients switch on.")
    detail = serializers.CharField(required=False)
    # The metaclass moves declared fields off the class, so `.errors` stays the property.
    errors = serializers.JSONField(  # type: ignore[assignment]
        required=False, help_text="Details: {field: [messages]}, ..."
    )

    class Meta:
        ref_name = "Problem"


class ShopAutoSchema(AutoSchema):
    def _map_basic_serializer(self, serializer, direction):
        schema = super()._map_basic_serializer(serializer, direction)
        if direction != "request":
            return schema
        if isinstance(serializer, ClosedSerializer):
            schema["additionalProperties"] = False
        properties = schema.get("properties", {})
        for name, field in serializer.fields.items():
            if field.read_only or name not in properties or not is_list_serializer(field):
                continue
            lengths: Any = field  # the stubs' ListSerializer has no min_length / max_length
            if not field.allow_empty:
                properties[name]["minItems"] = max(1, lengths.min_length or 0)
            elif lengths.min_length:
                properties[name]["minItems"] = lengths.min_length
            if lengths.max_length is not None:
                properties[name]["maxItems"] = lengths.max_length
        schema.update(getattr(serializer, "openapi_extra", {}))
        return schema

    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None or not path.startswith("/api/"):
            return operation
        responses = operation.setdefault("responses", {})
        for status in self._generic_error_statuses(operation):
            responses.setdefault(status, {"description": GENERIC_DESCRIPTIONS[status]})
        problem = self.resolve_serializer(ProblemSerializer, "response").ref
        for status, response in responses.items():
            if status.isdigit() and int(status) >= 400:
                response["content"] = {PROBLEM_CONTENT_TYPE: {"schema": problem}}
                if not response.get("description"):
                    response["description"] = GENERIC_DESCRIPTIONS.get(status, "")
        return operation

    def _generic_error_statuses(self, operation) -> list[str]:
        view = self.view
        parameters = operation.get("parameters", [])
        has_body = "requestBody" in operation or self.method in ("POST", "PUT", "PATCH")
        keyed = any(
            p.get("in") == "header" and p.get("name") == IDEMPOTENCY_KEY_HEADER for p in parameters
        )
        authenticators = list(getattr(view, "authentication_classes", []))
        permissions = list(getattr(view, "permission_classes", []))
        statuses = []
        if has_body or keyed or any(p.get("in") in ("query", "header") for p in parameters):
            statuses.append("400")
        if authenticators:
            statuses.append("401")
        unsafe = self.method not in ("GET", "HEAD", "OPTIONS")
        if any(p is not AllowAny for p in permissions) or (
            unsafe and any(issubclass(a, SessionAuthentication) for a in authenticators)
        ):
            statuses.append("403")
        if any(p.get("in") == "path" for p in parameters):
            statuses.append("404")
        if keyed:
            statuses += ["409", "422"]
        if has_body:
            statuses += ["413", "415"]
        if getattr(view, "throttle_classes", None):
            statuses.append("429")
        return statuses
