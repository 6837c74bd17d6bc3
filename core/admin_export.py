"""CSV exports from the admin, streamed: a long list never loads into memory.

`CsvExportMixin` adds "Export CSV" to a changelist: the rows as the list is
filtered, searched and ordered at that moment, written row by row from a
server-side cursor (`QuerySet.iterator(chunk_size=...)`) into a
`StreamingHttpResponse`. At most one chunk of rows is in memory at a time,
however many rows the list has. Reading needs the model's view permission.
"""

from __future__ import annotations

import csv
import datetime
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from django.core.exceptions import PermissionDenied
from django.http import StreamingHttpResponse
from django.urls import path

CHUNK_SIZE = 2000
# A cell a spreadsheet would take for a formula is written as text (CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


class _Echo:
    """A file-like object whose write() returns the line, for csv.writer in a generator."""

    def write(self, value: str) -> str:
        return value


def csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_lines(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(list(header))
    for row in rows:
        yield writer.writerow([csv_cell(value) for value in row])


def csv_response(*, filename: str, header: Iterable[str], rows: Iterable) -> StreamingHttpResponse:
    """A streamed CSV download: `rows` is consumed lazily while the response is sent."""
    response = StreamingHttpResponse(
        csv_lines(header, rows), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


class CsvExportMixin:
    """A ModelAdmin mixin: `export.csv` under the changelist, for the rows the list shows.

    `csv_columns` is a list of (header, field path) pairs, read with
    `values_list`, so a related column (`owner__email`) is one join, not one
    query per row.
    """

    csv_columns: ClassVar[list[tuple[str, str]]] = []
    csv_filename: ClassVar[str] = "export.csv"

    def get_urls(self):
        opts = self.model._meta  # type: ignore[attr-defined]
        view = self.admin_site.admin_view(self.csv_export_view)  # type: ignore[attr-defined]
        return [
            path("export.csv", view, name=f"{opts.app_label}_{opts.model_name}_export"),
            *super().get_urls(),  # type: ignore[misc]
        ]

    def csv_queryset(self, request):
        """The changelist's rows as filtered and searched now (its own query string)."""
        changelist = self.get_changelist_instance(request)  # type: ignore[attr-defined]
        return changelist.get_queryset(request)

    def csv_export_view(self, request):
        if not self.has_view_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        paths = [column for _, column in self.csv_columns]
        rows = self.csv_queryset(request).values_list(*paths).iterator(chunk_size=CHUNK_SIZE)
        return csv_response(
            filename=self.csv_filename, header=[h for h, _ in self.csv_columns], rows=rows
        )
