"""Cursor pagination with the contract's `{results, next}` envelope."""

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

    def paginate_queryset(self, queryset, request, view=None):
        try:
            return super().paginate_queryset(queryset, request, view)
        except NotFound as exc:
            raise InvalidRequest(
                "The cursor is invalid.", errors={"cursor": [str(exc.detail)]}
            ) from exc

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
