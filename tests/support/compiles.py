"""Count the ORM queries compiled inside a block: for reads and writes written once as SQL."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

from django.db.models.sql.query import Query


@contextlib.contextmanager
def orm_compiles() -> Iterator[list]:
    """Yield a list that collects the model of every ORM query compiled in the block.

    Every ORM statement (select, insert, update, delete) gets its compiler
    from `Query.get_compiler`; SQL run through a cursor does not.
    """
    seen: list = []
    get_compiler = Query.get_compiler

    def counting(self, *args, **kwargs):
        seen.append(self.model)
        return get_compiler(self, *args, **kwargs)

    with mock.patch.object(Query, "get_compiler", counting):
        yield seen
