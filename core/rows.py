"""Model instances from the rows of SQL written once per process, as the ORM makes them.

A read that every request makes the same way (a keyed checkout's products,
its key's row) costs more CPU in the ORM building and compiling the query
than in running it (docs/performance.md, "Where the checkout's CPU goes").
Such a read writes its SQL once per process from the models' tables and
columns (`select_list`) and turns each row back into an instance here:
every field's database converters applied (a JSON field's text decoded, as
the ORM does), then `Model.from_db`, so the instance is the one the ORM
would have returned.

`raw` is `Model.objects.raw(sql, params)` for the statements run on every
checkout: the same instances, annotations and refusals, with the mapping of
the answer's columns onto the model worked out once per process and shape
instead of on every call (a `RawQuerySet` resolves them, and its
converters, again each time).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from django.core.exceptions import FieldDoesNotExist
from django.db import connections, router
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


def raw(model: type[M], sql: str, params: Sequence[Any]) -> list[M]:
    """`list(model.objects.raw(sql, params))`: one instance per row, extra columns as attributes.

    Like `RawQuerySet`: parameters adapted with `adapt_unknown_value`, the
    model's fields filled from the columns named after them (the others
    deferred), every other column set on the instance, each field's
    converters applied; a statement whose answer lacks the primary key
    raises `FieldDoesNotExist`.
    """
    alias = router.db_for_read(model)
    connection = connections[alias]
    adapt = connection.ops.adapt_unknown_value
    with connection.cursor() as cursor:
        cursor.execute(sql, tuple(adapt(value) for value in params))
        columns = tuple(column[0] for column in cursor.description)
        rows = cursor.fetchall()
    plan = _raw_plan(model, alias, columns)
    found = []
    for row in rows:
        values = list(row)
        for index, expression, converters in plan.converters:
            for converter in converters:
                values[index] = converter(values[index], expression, connection)
        instance = model.from_db(alias, plan.names, [values[pos] for pos in plan.positions])
        for name, pos in plan.annotations:
            setattr(instance, name, values[pos])
        found.append(instance)
    return found


class _RawPlan:
    """Where a raw answer's columns go: `RawQuerySet.resolve_model_init_order`, kept."""

    def __init__(self, model: type[Model], alias: str, columns: tuple[str, ...]) -> None:
        connection = connections[alias]
        identifier = connection.introspection.identifier_converter
        # A field without a column (none of the shop's) is never read, as by RawQuerySet.
        by_column = {identifier(f.column): f for f in model._meta.fields if f.column}
        init = [(c, f) for c, f in by_column.items() if c in columns]
        self.names = [f.attname for _, f in init]
        if model._meta.pk.attname not in self.names:
            raise FieldDoesNotExist("Raw query must include the primary key")
        self.positions = [columns.index(c) for c, _ in init]
        self.annotations = [(c, pos) for pos, c in enumerate(columns) if c not in by_column]
        self.converters: list[tuple[int, Any, list[Callable]]] = []
        for pos, name in enumerate(columns):
            field = by_column.get(name)
            if field is None:
                continue
            expression = field.get_col(field.model._meta.db_table)
            found = connection.ops.get_db_converters(expression)
            found += expression.get_db_converters(connection)
            if found:
                self.converters.append((pos, expression, found))


@functools.cache
def _raw_plan(model: type[Model], alias: str, columns: tuple[str, ...]) -> _RawPlan:
    return _RawPlan(model, alias, columns)
