"""``filter=``: the predicate that picks a dataset's rows, checked once at the boundary.

A filter is a ``pyarrow.compute`` expression (``pc.field("label") != 0``) or the list of
tuples that ``pyarrow.parquet.read_table(filters=...)`` takes (``[("label", "!=", 0)]``; a
list of such lists ORs them). A row is kept where it is true; false and null leave it out, as
SQL's ``WHERE`` does. The dataset counts the rows kept in each row group when it opens
(``_dataset.py``), so every plan built on the counts (``len``, exactly-once epochs, even
ranks, resume cursors, ``ds[i]``) is a plan of the filtered rows; each read of a row group
applies the filter again (``_read.py``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ._errors import ColumnNotFoundError, DataError, InvalidArgumentError

_MISSING = re.compile(r"No match for (FieldRef.*?) in ")  # pyarrow's message


@dataclass(frozen=True)
class RowFilter:
    """A checked filter: its expression, the dataset columns it reads, typed, and its text."""

    expression: pc.Expression
    schema: pa.Schema  # the columns the expression reads, with the dataset's types
    text: str  # str(expression): stable, shown in errors and kept in resume states

    @property
    def columns(self) -> list[str]:
        return list(self.schema.names)

    @classmethod
    def of(cls, value: Any, schema: pa.Schema) -> RowFilter:
        """``value`` (an expression or DNF tuples) checked against the dataset's ``schema``,
        every column its files and partition folders hold, projected or not."""
        expression = _expression(value)
        text = str(expression)
        empty = schema.empty_table()
        _bind(expression, empty, text, schema)
        used = _used(expression, empty, list(schema.names))
        return cls(expression, pa.schema([schema.field(n) for n in used]), text)

    def apply(self, table: pa.Table, where: str) -> pa.Table:
        """The rows of ``table`` the filter keeps, in order (``where``: the file and row group,
        for the error an expression failing on these values raises, say an overflow)."""
        try:
            return table.filter(self.expression)
        except (pa.ArrowException, ValueError) as exc:
            raise DataError(f"{where}: filter {self.text} failed on its values ({exc}); "
                            "change the filter") from exc


def _expression(value: Any) -> pc.Expression:
    if isinstance(value, pc.Expression):
        return value
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and value:
        try:
            return pq.filters_to_expression(value)  # the DNF of pq.read_table(filters=...)
        except (TypeError, ValueError, pa.ArrowException) as exc:
            raise InvalidArgumentError(
                f"filter={value!r:.200} is not a valid list of (column, op, value) tuples "
                f"({exc}); see pyarrow.parquet.read_table's filters=, or pass a "
                "pyarrow.compute expression such as pc.field('label') > 0") from exc
    raise InvalidArgumentError(
        f"filter={value!r:.200}: pass a pyarrow.compute expression such as "
        "pc.field('label') > 0, a list of (column, op, value) tuples, or None for every row")


def _bind(expression: pc.Expression, empty: pa.Table, text: str, schema: pa.Schema) -> None:
    """Raise what is wrong with the expression on these columns: an unknown one, a type."""
    try:
        empty.filter(expression)
    except pa.ArrowInvalid as exc:
        missing = _MISSING.search(str(exc))
        if missing:
            names = schema.names if len(schema) <= 30 else [*schema.names[:30], "..."]
            raise ColumnNotFoundError(
                f"filter {text} reads column {_path(missing.group(1))!r}, which the dataset "
                f"does not have; it has {names}") from None
        raise InvalidArgumentError(f"filter {text}: {exc}") from None
    except (pa.ArrowException, ValueError, TypeError) as exc:  # a type, or not a boolean
        raise InvalidArgumentError(f"filter {text} does not fit the columns' types: {exc}"
                                   ) from None


def _path(ref: str) -> str:
    """pyarrow's ``FieldRef.Name(a)`` as ``a``, ``FieldRef.Nested(FieldRef.Name(s)
    FieldRef.Name(a))`` as ``s.a``."""
    nested = ref.removeprefix("FieldRef.Nested(").removesuffix(")") if ref.startswith(
        "FieldRef.Nested(") else ref
    parts = [p.removeprefix("FieldRef.").removeprefix("Name(").removesuffix(")")
             for p in nested.split(" FieldRef.")]
    return ".".join(parts)


def _used(expression: pc.Expression, empty: pa.Table, names: list[str]) -> list[str]:
    """The columns the expression reads (pyarrow does not list them): those it cannot be bound
    without. Groups of columns are dropped at once and halved only when the expression needs
    one of them, so a filter of k columns of a wide table costs ~k log n bindings of a 0-row
    table."""

    def binds_without(group: list[str]) -> bool:
        try:
            empty.drop_columns(group).filter(expression)
        except pa.ArrowException:
            return False
        return True

    def search(group: list[str]) -> list[str]:
        if not group or binds_without(group):
            return []
        if len(group) == 1:
            return group
        half = len(group) // 2
        return search(group[:half]) + search(group[half:])

    return search(names)
