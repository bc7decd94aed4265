"""write_dataset's inputs as one schema and a stream of record batches: pyarrow tables and
readers, pandas and polars DataFrames, iterables of dicts or record batches. Values are never
changed on the way: a later chunk that the first one's types cannot hold is a DataError naming
the rows and the column."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from ._casts import cast_exactly, keeps_values, same_values
from ._errors import DataError, InvalidArgumentError
from ._mixed import guess_kept, kinds_said
from ._pandas import pandas_batches


def _check_keys(chunk: list[Any], names: frozenset[str], first_row: int,
                whose: str = "the first row") -> None:
    # pyarrow takes the columns from the first row's keys and drops other keys silently.
    for k, row in enumerate(chunk):
        if not isinstance(row, dict):
            raise DataError(f"row {first_row + k} is a {type(row).__name__}, the first rows "
                            "are dicts; give an iterable of dicts only")
        if not row.keys() <= names:
            extra = sorted(map(str, row.keys() - names))
            raise DataError(
                f"row {first_row + k} has keys {extra} that {whose} lacks (it has "
                f"{sorted(names)}); give every row the same keys, or give write_dataset a "
                "schema= that holds them all"
            )


_SIZED_ROWS = 16  # rows of a chunk of dicts whose sizes stand for the chunk's


def _row_size(row: dict[str, Any]) -> int:
    """About the bytes of a dict row: its texts', bytes' and arrays' lengths, 8 a value else."""
    size = 0
    for value in row.values():
        if isinstance(value, (str, bytes, bytearray, memoryview)):
            size += len(value)
        elif isinstance(value, np.ndarray):
            size += value.nbytes
        elif isinstance(value, (list, tuple)):
            size += 8 * len(value)
        else:
            size += 8
    return size


def _chunk(rows: Iterator[Any], most: int, chunk_bytes: int | None) -> list[Any]:
    """The next ``most`` rows, or fewer where its first rows say they hold more than
    ``chunk_bytes`` (dicts of 1 MB images were buffered 65,536 at a time, 64 GB, before the
    first 16 MiB row group was written; found in review)."""
    chunk = list(itertools.islice(rows, min(most, _SIZED_ROWS)))
    if chunk_bytes is not None and len(chunk) == _SIZED_ROWS and most > _SIZED_ROWS:
        per_row = max(1, sum(map(_row_size, chunk)) // _SIZED_ROWS)
        most = max(_SIZED_ROWS, min(most, chunk_bytes // per_row))
    chunk += itertools.islice(rows, most - len(chunk))
    return chunk


def _typed_head(head: list[Any], rows: Iterator[Any], most: int) -> list[Any]:
    """``head``, with more rows while a key is None in all of them, up to ``most`` rows:
    the first rows type the columns, and a chunk sized in bytes (a few dozen rows of
    images) left a key None in all of them typed null, refusing its later values, where
    65,536 rows had typed it (found in review)."""
    untyped = {k for k in head[0] if all(row.get(k) is None for row in head)} if head else set()
    while untyped and len(head) < most:
        more = list(itertools.islice(rows, min(len(head), most - len(head))))
        if not more:
            break
        head += more
        untyped = {k for k in untyped if all(row.get(k) is None for row in more)}
    return head


def _dict_batches(first: dict[str, Any], rest: Iterator[Any], chunk_rows: int,
                  given: pa.Schema | None, chunk_bytes: int | None = None
                  ) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    rows = itertools.chain([first], rest)
    head = _chunk(rows, chunk_rows, chunk_bytes)
    if given is None and chunk_bytes is not None:
        head = _typed_head(head, rows, chunk_rows)
    # as pyarrow, without a schema: the columns are the first row's keys, the types the
    # first rows'; with one, every chunk is converted to it, the first too (a key may lack)
    names = frozenset(first) if given is None else frozenset(given.names)
    whose = "the first row" if given is None else "the schema"
    _check_keys(head, names, 0, whose)
    if keys := sorted({repr(k) for k in names if not isinstance(k, str)}):  # (a raw
        raise DataError(f"the first row's keys {', '.join(keys)} are not text; columns are "
                        "named by text: give every row's keys as str")  # TypeError before)
    inferred_head, schema = None, given
    if schema is None:
        try:
            inferred_head = pa.Table.from_pylist(head)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError) as exc:
            raise DataError(
                f"the first {len(head)} rows do not make one table{_which(head)}: {exc}; make "
                "every row's values of a key the same type (ints past int64: give a schema= "
                "with uint64 or a decimal), or give write_dataset a schema="
            ) from exc
        for name, column in zip(inferred_head.column_names, inferred_head.columns,
                                strict=True):
            values = [row.get(name) for row in head]
            if not guess_kept(values, column):
                raise DataError(
                    f"rows 0..{len(head) - 1}, column {name!r}: pyarrow would write its values "
                    f"({kinds_said(values)}) as {column.type}, changing some; make them one kind "
                    "that it keeps, or give write_dataset a schema=")
        schema = inferred_head.schema
    taken = f"was taken from the first {len(head)} rows"
    source = "given by schema=" if given is not None else (
        f"{taken}: make those carry the wider type (e.g. 1.0, not 1), or give write_dataset a "
        "schema=")
    nulls = f"{taken}, where the column holds only nulls or empty lists: give write_dataset a " \
        "schema= with its type"

    def gen() -> Iterator[pa.RecordBatch]:
        done = 0
        chunk = head
        while chunk:
            if done:
                _check_keys(chunk, names, done, whose)
            if done == 0 and inferred_head is not None:
                yield from inferred_head.to_batches()
            else:
                yield from _convert(chunk, schema, done, source, nulls,
                                    asked=given is not None).to_batches()
            done += len(chunk)
            chunk = _chunk(rows, chunk_rows, chunk_bytes)

    return schema, gen()


def _convert(chunk: list[dict[str, Any]], schema: pa.Schema, done: int,
             source: str, nulls: str, *, asked: bool) -> pa.Table:
    """Rows ``done ..`` as ``schema``'s types, or the DataError naming the column that does
    not fit them (``source``: where those types came from, and what to do; ``nulls`` instead
    for a column typed null by the first rows, which no value told). ``asked``:
    ``schema`` was given (``schema=``), and floats are rounded into it, as :func:`conform`
    does; the first rows' types take them only as they are."""
    try:  # every column inferred at once; one that fails is found and named below
        inferred = pa.Table.from_struct_array(pa.array(chunk))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError,
            ValueError):
        inferred = None  # (uuid.UUID values: no struct of extension types)
    columns = []
    for field in schema:
        try:
            columns.append(_column(chunk, field, inferred, asked=asked))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                OverflowError, ValueError) as exc:  # (ValueError: a NaN among aware
            # datetimes, "cannot convert float NaN to integer": found by fuzzing)
            said = source if asked or not _unknown(field.type) else nulls
            raise DataError(
                f"rows {done}..{done + len(chunk) - 1}, column {field.name!r}: {exc}; "
                f"its type, {field.type}, {said}"
            ) from exc
    return _not_null(pa.Table.from_arrays(columns, schema=schema),
                     f"rows {done}..{done + len(chunk) - 1}")


def _unknown(t: pa.DataType) -> bool:
    """Whether a column's type inferred from values is pyarrow's null type, or lists of it:
    no value told it (a struct with a field of nulls beside others is not: its error may be
    another field's, found in review)."""
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    return bool(pa.types.is_null(t))


def _column(chunk: list[dict[str, Any]], field: pa.Field,
            inferred: pa.Table | None, *, asked: bool) -> pa.ChunkedArray | pa.Array:
    """The chunk's values of ``field`` as its type, refused (raised) where one would change."""
    # Given the type, pyarrow converts 2.5 into an int64 column as 2 and drops a struct's keys
    # the type lacks, silently: the values are inferred, then changed only within their kind
    # (_casts.py). The typed conversion still runs, as a check, because it refuses what such
    # a cast would coerce. Where the kinds differ (ints for decimals, dicts for a map, ints past
    # int64 for uint64), its values are compared with the rows' own.
    def values() -> list[Any]:
        return [row.get(field.name) for row in chunk]

    try:
        column = inferred.column(field.name) if inferred is not None \
            and field.name in inferred.column_names else pa.array(values())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError):
        column = None  # no one type holds them as they are (ints past int64)
    if column is not None and column.type == field.type:
        if not guess_kept(values(), column):  # (pyarrow's guess: a date for a datetime)
            raise pa.ArrowInvalid(f"pyarrow's guess changes its values ({kinds_said(values())})")
        return column
    if column is not None and keeps_values(column.type, field.type):
        if not pa.types.is_null(column.type):  # only None: any type holds it
            pa.array(values(), type=field.type)
        try:
            return cast_exactly(column, field.type, round_floats=asked)
        except (ValueError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # (int64 as decimal128(10, 2): Arrow wants 21 digits; a double the first
            # rows' float32 would round) the values, compared:
    typed = pa.array(values(), type=field.type)
    if not same_values(values(), typed.to_pylist(), field.type):
        kind = "values" if column is None else f"{column.type} values"
        raise pa.ArrowInvalid(f"its {kind} would not stay the same as {field.type}")
    return typed


def _which(rows: list[dict[str, Any]]) -> str:
    """``, column 'x'``: the first whose values alone do not convert (an error path only)."""
    for name in rows[0]:
        try:
            pa.array([row.get(name) for row in rows])
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError):
            return f", column {name!r}"
    return ""


def as_batches(
    data: Any, chunk_rows: int, schema: pa.Schema | None = None,
    chunk_bytes: int | None = None,
) -> tuple[pa.Schema, Iterator[pa.RecordBatch], int | None]:
    """Normalise any supported input to (schema, stream of record batches, rows if known).
    Dicts are converted ``chunk_rows`` at a time, or fewer that hold ``chunk_bytes``.

    With ``schema``, that is the schema: the batches are the input's (the caller conforms
    them, :func:`conform`), but dicts are converted to it from the first row on.
    """
    if schema is not None and not isinstance(schema, pa.Schema):
        raise InvalidArgumentError(
            f"schema must be a pyarrow.Schema, got {type(schema).__name__} (e.g. "
            "pa.schema({'id': pa.int64(), 'text': pa.string()}))")
    if schema is not None and len(set(schema.names)) != len(schema.names):
        raise InvalidArgumentError(f"schema= names a column twice: {schema.names}")
    if schema is not None and not len(schema):
        raise InvalidArgumentError("schema= has no column; give the columns to write")
    found, batches, total = _as_batches(data, chunk_rows, schema, chunk_bytes)
    return schema or found, batches, total


def _as_batches(
    data: Any, chunk_rows: int, given: pa.Schema | None, chunk_bytes: int | None = None
) -> tuple[pa.Schema, Iterator[pa.RecordBatch], int | None]:
    if isinstance(data, pa.Table):
        return data.schema, iter(data.to_batches(max_chunksize=chunk_rows)), data.num_rows
    if isinstance(data, pa.RecordBatch):
        return data.schema, iter([data]), data.num_rows
    if isinstance(data, pa.RecordBatchReader):
        return data.schema, iter(data), None
    module = type(data).__module__.split(".")[0]
    if module == "pandas":
        schema, batches = pandas_batches(data, chunk_rows)
        return schema, batches, len(data)
    if module == "polars" and hasattr(data, "to_arrow"):
        return _as_batches(data.to_arrow(), chunk_rows, given)
    if hasattr(data, "__arrow_c_stream__"):
        return _as_batches(pa.RecordBatchReader.from_stream(data), chunk_rows, given)
    if isinstance(data, Iterable) and not isinstance(data, (str, bytes, dict)):
        it = iter(data)
        first = next(it, None)
        if first is None:
            raise InvalidArgumentError("data is empty: nothing to write")
        if isinstance(first, pa.RecordBatch):
            return first.schema, itertools.chain([first], it), None
        if isinstance(first, dict):
            schema, batches = _dict_batches(first, it, chunk_rows, given, chunk_bytes)
            return schema, batches, None
        raise InvalidArgumentError(
            f"an iterable of {type(first).__name__} cannot be written; give dicts or "
            "pyarrow.RecordBatch items"
        )
    raise InvalidArgumentError(
        f"cannot write a {type(data).__name__}; give a pyarrow Table, RecordBatchReader, a "
        "pandas or polars DataFrame, or an iterable of dicts or RecordBatches"
    )


def conform(batch: pa.RecordBatch, schema: pa.Schema, number: int,
            whose: str = "the first had", *, asked: bool = False) -> pa.RecordBatch:
    """A later record batch as the first one's schema (or the one given, ``whose`` says):
    columns by name, types cast safely. ``asked``: ``schema`` is one given (``schema=``), into
    which floats are rounded; the first batch's takes them only as they are."""
    names, first = batch.schema.names, schema.names
    if names != first:
        if sorted(names) != sorted(first) or len(set(names)) != len(names):
            extra, missing = sorted(set(names) - set(first)), sorted(set(first) - set(names))
            why = [f"extra {extra}"] * bool(extra) + [f"missing {missing}"] * bool(missing)
            raise DataError(f"record batch {number} (from 0) has columns {names}, {whose} "
                            f"{first} ({', '.join(why) or 'a name twice'}); give every batch "
                            "the same columns")
        batch = batch.select(first)  # the same names in another order
        if batch.schema.equals(schema):
            return batch
    columns = []
    for column, f, g in zip(batch.columns, batch.schema, schema, strict=True):
        try:  # within the values' kind only (_casts.py): Arrow's cast parses "007" as 7
            columns.append(column if f.type.equals(g.type) else cast_exactly(
                column, g.type, round_floats=asked))
        except (ValueError, pa.ArrowInvalid, pa.ArrowTypeError, NotImplementedError) as exc:
            raise DataError(f"record batch {number} (from 0): column {f.name!r} is {f.type}, "
                            f"{whose} {g.type}: {exc}; convert it before writing, or give "
                            "write_dataset a schema= that holds it") from exc
    return _not_null(pa.RecordBatch.from_arrays(columns, schema=schema),
                     f"record batch {number} (from 0)")


def _not_null(batch: Any, where: str) -> Any:
    """``batch`` (a RecordBatch or Table), or the DataError naming a column declared not null
    that holds nulls (Arrow builds it, and the Parquet writer fails later, files written)."""
    for f, column in zip(batch.schema, batch.columns, strict=True):
        if not f.nullable and column.null_count:
            raise DataError(f"{where}, column {f.name!r}: {column.null_count:,} nulls in a column "
                            "declared not null; fill them, or declare the field nullable")
    return batch
