"""Count the ORM queries built inside a block: for statements written once as SQL (core.rows)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

from django.db.models.sql.query import Query, RawQuery


@contextlib.contextmanager
def orm_compiles() -> Iterator[list]:
    """Yield a list that collects every ORM query compiled, or raw query built, in the block.

    Every ORM statement (select, insert, update, delete) gets its compiler
    from `Query.get_compiler` (its model is recorded); every `Model.objects.raw`
    builds a `RawQuery` (its SQL's first words are recorded). SQL run
    through a cursor does neither.
    """
    seen: list = []
    get_compiler = Query.get_compiler
    raw_init = RawQuery.__init__

    def counting(self, *args, **kwargs):
        seen.append(self.model)
        return get_compiler(self, *args, **kwargs)

    def raw_counting(self, sql, *args, **kwargs):
        seen.append(("raw", " ".join(sql.split()[:6])))
        raw_init(self, sql, *args, **kwargs)

    with (
        mock.patch.object(Query, "get_compiler", counting),
        mock.patch.object(RawQuery, "__init__", raw_counting),
    ):
        yield seen
