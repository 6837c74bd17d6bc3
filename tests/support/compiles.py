"""Count the ORM queries compiled inside a block: for reads written once as SQL (core.rows)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

from django.db.models.sql.compiler import SQLCompiler


@contextlib.contextmanager
def orm_compiles() -> Iterator[list]:
    """Yield a list that collects the model of every ORM query compiled in the block."""
    seen: list = []
    as_sql = SQLCompiler.as_sql

    def counting(self, *args, **kwargs):
        seen.append(self.query.model)
        return as_sql(self, *args, **kwargs)

    with mock.patch.object(SQLCompiler, "as_sql", counting):
        yield seen
