"""Model instances from the rows of SQL written once per process, as the ORM makes them.

A read that every request makes the same way (a keyed checkout's products,
its key's row) costs more CPU in the ORM building and compiling the query
than in running it (docs/performance.md, "Where the checkout's CPU goes").
Such a read writes its SQL once per process from the models' tables and
columns (`select_list`) and turns each row back into an instance here:
every field's database converters applied (a JSON field's text decoded, as
the ORM does), then `Model.from_db`, so the instance is the one the ORM
would have returned.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from django.db import connections
from django.db.models import Field, Model


def column(model: type[Model], name: str, *, alias: str) -> str:
    """The quoted column of field `name` of `model`."""
    field = model._meta.get_field(name)
    assert isinstance(field, Field) and field.column
    return connections[alias].ops.quote_name(field.column)


def select_list(model: type[Model], table: str, *, alias: str) -> str:
    """Every concrete column of `model`, qualified by `table`, in `RowReader`'s order."""
    return ", ".join(
        f"{table}.{column(model, field.name, alias=alias)}" for field in model._meta.concrete_fields
    )


M = TypeVar("M", bound=Model)


class RowReader(Generic[M]):
    """Turns the `width` values of `select_list(model)` into an instance of `model`."""

    def __init__(self, model: type[M], alias: str) -> None:
        connection = connections[alias]
        fields = model._meta.concrete_fields
        self.model = model
        self.alias = alias
        self.width = len(fields)
        self.attnames = [field.attname for field in fields]
        # (index, field's column expression, its converters): only fields that have any.
        self.converters: list[tuple[int, Any, list[Callable]]] = []
        for index, field in enumerate(fields):
            expression = field.get_col(model._meta.db_table)
            found = connection.ops.get_db_converters(expression)
            found += expression.get_db_converters(connection)
            if found:
                self.converters.append((index, expression, found))

    @staticmethod
    def of(model: type[M], alias: str) -> RowReader[M]:
        """The reader of `model` for database `alias`, made once per process."""
        return _reader(model, alias)

    def read(self, values: Sequence[Any]) -> M:
        """The instance the ORM would make of `values` (exactly `width` of them)."""
        if self.converters:
            values = list(values)
            connection = connections[self.alias]
            for index, expression, converters in self.converters:
                for converter in converters:
                    values[index] = converter(values[index], expression, connection)
        return self.model.from_db(self.alias, self.attnames, values)


@functools.cache
def _reader(model: type[Model], alias: str) -> RowReader[Any]:
    return RowReader(model, alias)
