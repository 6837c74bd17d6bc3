"""Cursor pagination with the contract's `{results, next}` envelope."""

import re

from rest_framework.exceptions import NotFound
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response

from .errors import InvalidRequest


class CursorPage(CursorPagination):
    """Paginate by an opaque cursor; 50 a page, `?page_size=` up to 200."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200
    ordering = "-created_at"

    def get_page_size(self, request):
        """Read `?page_size=`: a positive integer (above 200 means 200), else a 400."""
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        digits = raw.lstrip("0")
        if not re.fullmatch(r"[0-9]+", raw) or not digits:
            raise InvalidRequest(
                f"page_size must be an integer from 1 to {self.max_page_size}.",
                errors={"page_size": [f"An integer from 1 to {self.max_page_size}."]},
            )
        # Any number of digits: never int() a huge string (Python refuses over 4300 digits).
        return self.max_page_size if len(digits) > 9 else min(int(digits), self.max_page_size)

    def paginate_queryset(self, queryset, request, view=None):
        try:
            return super().paginate_queryset(queryset, request, view)
        except NotFound as exc:
            raise InvalidRequest(
                "The cursor is invalid.", errors={"cursor": [str(exc.detail)]}
            ) from exc

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                # 0 and negatives are a 400; above the maximum means the maximum.
                parameter["schema"] = {"type": "integer", "minimum": 1}
        return parameters

    def get_paginated_response(self, data):
        return Response({"results": data, "next": self.get_next_link()})

    def get_paginated_response_schema(self, schema):
        return {
            "type": "object",
            "required": ["results", "next"],
            "properties": {
                "results": schema,
                "next": {"type": "string", "nullable": True, "format": "uri"},
            },
        }
