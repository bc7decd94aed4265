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

import hashlib
import pickle
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ._errors import ColumnNotFoundError, DataError, InvalidArgumentError
from ._schema import holds

_MISSING = re.compile(r"No match for (FieldRef.*?) in ")  # pyarrow's message


@dataclass(frozen=True)
class RowFilter:
    """A checked filter: its expression, the dataset columns it reads, typed, and its text."""

    expression: pc.Expression
    schema: pa.Schema  # the columns the expression reads, with the dataset's types
    text: str  # str(expression), for messages: it shortens long value sets, so it is lossy
    key: str  # the expression whole (every literal, unit and type): what resume states keep
    nan_false: bool = False  # false on a NaN of any float column it reads (:func:`_nan_false`)

    @property
    def columns(self) -> list[str]:
        return list(self.schema.names)

    @classmethod
    def of(cls, value: Any, schema: pa.Schema, where: str) -> RowFilter:
        """``value`` (an expression or DNF tuples) checked against ``schema``: every column of
        ``where`` (the first file) and of the partition folders, projected or not."""
        expression = _expression(value)
        text = str(expression)
        if "FieldPath(" in text:  # pc.field(0): a position means another column once pruned
            raise InvalidArgumentError(
                f"filter {text} names a column by its position; name it: pc.field('name')")
        empty = schema.empty_table()
        _bind(expression, empty, text, schema, where)
        used = _used(expression, empty, list(schema.names))
        return cls(expression, pa.schema([schema.field(n) for n in used]), text, _key(expression),
                   _nan_false(value, schema))

    def apply(self, table: pa.Table, where: str) -> pa.Table:
        """The rows of ``table`` the filter keeps, in order (``where``: the file and row group,
        for the error an expression failing on these values raises, say an overflow)."""
        try:
            return self._typed(table).filter(self.expression)
        except (pa.ArrowException, ValueError) as exc:
            raise self._failed(where, exc) from exc

    def _typed(self, table: pa.Table) -> pa.Table:
        """``table`` with the filter's columns in the dataset's types, as the rows kept were
        counted: a file's own (timestamp[us] beside files in ns) made ``cast(int64)`` keep
        others, and the read fail as a file changed."""
        for field in self.schema:
            i = table.schema.get_field_index(field.name)
            if i >= 0 and not table.schema.field(i).type.equals(field.type):
                table = table.set_column(i, field.name, table.column(i).cast(field.type))
        return table

    def mask(self, table: pa.Table, where: str) -> np.ndarray:
        """Whether the filter keeps each row of ``table``: a bool per row, without copying the
        rows kept (what counting needs)."""
        try:
            plan = acero.Declaration.from_sequence([
                acero.Declaration("table_source", acero.TableSourceNodeOptions(
                    self._typed(table))),
                acero.Declaration("project", acero.ProjectNodeOptions([self.expression], ["k"]))])
            keep = plan.to_table(use_threads=False).column(0)  # one thread: rows in order
        except (pa.ArrowException, ValueError) as exc:
            raise self._failed(where, exc) from exc
        out: np.ndarray = pc.fill_null(keep, False).to_numpy(zero_copy_only=False)
        return out

    def _failed(self, where: str, exc: Exception) -> DataError:
        """The error of an expression failing on these values (an overflow, a bad cast)."""
        return DataError(f"{where}: filter {self.text} failed on its values ({exc}); change "
                         "the filter")


def _key(expression: pc.Expression) -> str:
    """The expression whole, as text. ``str()`` prints at most 20 values of an ``isin`` and
    drops literal units (``1 ns`` and ``1 s`` both print ``1``), so two filters keeping other
    rows printed alike. pyarrow serializes an expression as an Arrow IPC file: its schema
    holds the tree (calls, field names) and the literals' types, its batch the literals."""
    try:
        reader = pa.ipc.open_file(expression.__reduce__()[1][0])
        literals = [column.to_pylist() for column in reader.get_batch(0).columns]
    except (pa.ArrowException, IndexError, TypeError,  # another pyarrow's layout: its bytes
            ValueError, OverflowError):  # a literal Python cannot hold (a date past 9999)
        return hashlib.sha256(pickle.dumps(expression)).hexdigest()
    return f"{reader.schema}\n{literals!r}"


_NAN_FALSE = frozenset({"=", "==", "<", ">", "<=", ">="})  # NaN compares false to all


def _nan_false(value: Any, schema: pa.Schema) -> bool:
    """Whether ``value``, DNF tuples (ANDs of ORs, no negation), is false for a row whatever
    NaN its float columns hold: each of its tests of a float column a comparison, or ``in`` a
    set without NaN. Min/max statistics leave NaN out, so only such a filter may prune row
    groups by them (:func:`pqloader._kept._may_match`). An expression is not looked into.
    Nor may a set holding a zero (of ints too, cast to the floats): statistics write a row
    group of zeros as min -0.0, max +0.0, which pyarrow takes for -0.0 alone, and its
    ``is_in`` tells the zeros apart by their bits, so ``in {0.0}`` ruled the row group out
    (its rows were lost: found by a filter fuzzer; pyarrow's ``read_table(filters=)`` too)."""
    if isinstance(value, pc.Expression):
        return False
    groups = value if isinstance(value[0], Sequence) and not isinstance(value[0], str) and \
        value[0] and isinstance(value[0][0], Sequence) and not isinstance(value[0][0], str) \
        else [value]
    for column, op, operand in (test for group in groups for test in group):
        if column not in schema.names or not has_floats(schema.field(column).type):
            continue
        if op == "in":
            values = pa.array(list(operand)) if not isinstance(operand, pa.Array) else operand
            if pa.types.is_floating(values.type) and pc.any(pc.is_nan(values)).as_py():
                return False
            if (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)) and \
                    pc.any(pc.equal(values, 0)).as_py():  # (ints too: cast to the column's)
                return False
        elif op not in _NAN_FALSE:
            return False
    return True


def has_floats(t: pa.DataType) -> bool:
    """A float type, or one holding floats in its lists, structs or dictionary."""
    return holds(t, pa.types.is_floating)


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


def _bind(expression: pc.Expression, empty: pa.Table, text: str, schema: pa.Schema,
          where: str) -> None:
    """Raise what is wrong with the expression on these columns: an unknown one, a type."""
    try:
        empty.filter(expression)
    except pa.ArrowInvalid as exc:
        missing = _MISSING.search(str(exc))
        if missing:
            names = schema.names if len(schema) <= 30 else [*schema.names[:30], "..."]
            raise ColumnNotFoundError(
                f"filter {text} reads column {_path(missing.group(1))!r}, which {where} does "
                f"not have (every file needs the filter's columns); it has {names}") from None
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
        dropped = set(group)
        try:  # select, not drop_columns: that costs O(n) a column, seconds at 2,000 columns;
            # by position: a name written twice in the file is a KeyError by name
            empty.select([i for i, n in enumerate(names) if n not in dropped]).filter(expression)
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
