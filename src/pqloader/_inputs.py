"""write_dataset's inputs as one schema and a stream of record batches: pyarrow tables and
readers, pandas and polars DataFrames, iterables of dicts or record batches. Values are never
changed on the way: a later chunk that the first one's types cannot hold is a DataError naming
the rows and the column."""

from __future__ import annotations

import datetime
import itertools
import re
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from ._casts import cast_exactly, keeps_values, same_values
from ._errors import DataError, InvalidArgumentError
from ._schema import holds

_UNNAMED_INDEX = re.compile(r"__index_level_\d+__")


def _pandas_error(df: Any, exc: Exception, where: str) -> DataError:
    """``exc`` from pyarrow's pandas conversion as a DataError naming the column at fault."""
    said = [m for a in exc.args[1:] if isinstance(a, str)
            and (m := re.fullmatch(r"Conversion failed for column (.*) with type (\S+)", a))]
    if said:
        column = f", column {said[0][1]!r} ({said[0][2]})"
    else:  # Schema.from_pandas does not say which column: find it, on this error path only
        def fails(name: Any) -> bool:
            try:
                pa.Schema.from_pandas(df[[name]], preserve_index=False)
            except (ValueError, TypeError, OverflowError, pa.ArrowNotImplementedError):
                return True
            return False

        bad = next((n for n in df.columns if fails(n)), None) if df.columns.is_unique else None
        column = "" if bad is None else f", column {bad!r}"
    return DataError(f"{where}{column}: {exc.args[0] if exc.args else exc}; give each column "
                     "one type and a unique name (e.g. df[col].astype(str)), or write a "
                     "pyarrow Table with an explicit schema")


def _pandas_batches(df: Any, chunk_rows: int) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    # Column names that are not str (pd.DataFrame(array) names them 0, 1, ...): the schema
    # names them as str, and each chunk's columns must be named so for pyarrow to find them
    names = [str(n) for n in df.columns]
    renamed = any(not isinstance(n, str) for n in df.columns)
    if renamed and len(set(names)) != len(names):
        raise DataError(f"the DataFrame's column names {list(df.columns)} are the same once "
                        "written as text (Parquet names are text); rename them apart")
    # A named index level (df.set_index("user_id"), a MultiIndex's named levels) is data:
    # it becomes a column. An unnamed one (what df[df.x > 0] leaves) is a position, not
    # data: pandas' to_parquet would write it as "__index_level_0__", a column in every
    # batch that nobody asked for; it is left out.
    try:
        schema = pa.Schema.from_pandas(df, preserve_index=True)
    except (ValueError, TypeError, OverflowError, pa.ArrowNotImplementedError) as exc:
        raise _pandas_error(df, exc, "the DataFrame") from exc
    # pandas' metadata kept: read_parquet gives back the dtypes (Int64, boolean, categories)
    # and the named index; it reads files whose metadata names the unnamed level left out
    schema = pa.schema([f for f in schema if not _UNNAMED_INDEX.fullmatch(f.name)],
                       metadata=schema.metadata)
    # Python values of kinds pyarrow's guess may change (dates beside datetimes, naive beside
    # aware, bytes beside str), in object columns, categories or named index levels: checked
    # as rows of dicts are
    guessed = [(source, name) for name, source in _untyped(df).items()
               if name in schema.names and holds(schema.field(name).type, _is_guessed)]
    # whether each holds values of one kind, over the whole frame: its type was guessed from
    # the whole frame, so a chunk of one kind may still be of another than the type's (dates,
    # then a chunk of datetimes, lost their time; found in review)
    uniform = {name: _one_kind_each(_kinds_of(df, source)) for source, name in guessed}

    def gen() -> Iterator[pa.RecordBatch]:
        for start in range(0, len(df), chunk_rows):
            chunk = df.iloc[start:start + chunk_rows]
            if renamed:
                chunk.columns = names  # (iloc made a new frame: df keeps its names)
            where = f"DataFrame rows {start}..{start + len(chunk) - 1}"
            try:
                table = pa.Table.from_pandas(chunk, schema=schema, preserve_index=True)
            except (ValueError, TypeError, OverflowError, pa.ArrowNotImplementedError) as exc:
                raise _pandas_error(chunk, exc, where) from exc
            for source, name in guessed:
                if uniform[name]:
                    continue
                values = _python_values(chunk, source)
                if not guess_kept(values, table.column(name), uniform=False):
                    what = "column" if source[0] == "column" else "index level"
                    raise DataError(
                        f"{where}, {what} {name!r}: pyarrow would write its values "
                        f"({_kinds(values)}) as {table.column(name).type}, changing some; "
                        "make them one kind that it keeps (e.g. df[col] = "
                        "pd.to_datetime(df[col]) for dates and times), or write a pyarrow "
                        "Table with an explicit schema")
            yield from table.to_batches()

    return schema, gen()


def _untyped(df: Any) -> dict[str, tuple[str, int]]:
    """The columns and named index levels of ``df`` that hold Python objects (object dtype,
    or a categorical's object categories), by name: ``("column", i)`` or ``("index", i)``."""
    def untyped(dtype: Any) -> bool:
        if getattr(dtype, "name", None) == "category":
            return str(dtype.categories.dtype) == "object"
        return str(dtype) == "object"

    found: dict[str, tuple[str, int]] = {}
    if df.columns.is_unique:
        for i, dtype in enumerate(df.dtypes):
            if untyped(dtype):
                found[str(df.columns[i])] = ("column", i)
    for i, name in enumerate(df.index.names):
        if name is not None and str(name) not in found \
                and untyped(df.index.get_level_values(i).dtype):
            found[str(name)] = ("index", i)
    return found


def _kinds_of(df: Any, source: tuple[str, int]) -> list[Any]:
    """Values of a column or index level (``source``) with every kind it holds: a
    categorical's categories stand for its values."""
    kind, i = source
    values = df.iloc[:, i] if kind == "column" else df.index.get_level_values(i)
    if getattr(values.dtype, "name", None) == "category":
        return list(values.dtype.categories)
    return _python_values(df, source)


def _python_values(chunk: Any, source: tuple[str, int]) -> list[Any]:
    """The values of a column or index level (``source``) as Python objects, pandas'
    missing values (NaN, NaT, pd.NA) as None."""
    kind, i = source
    values = chunk.iloc[:, i] if kind == "column" \
        else chunk.index.get_level_values(i).to_series()
    values = values.astype(object)  # a categorical's values, not its codes
    return list(values.where(values.notna(), None).tolist())


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


def _dict_batches(first: dict[str, Any], rest: Iterator[Any], chunk_rows: int,
                  given: pa.Schema | None) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    rows = itertools.chain([first], rest)
    head = list(itertools.islice(rows, chunk_rows))
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
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
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
                    f"({_kinds(values)}) as {column.type}, changing some; make them one kind "
                    "that it keeps, or give write_dataset a schema=")
        schema = inferred_head.schema
    source = "given by schema=" if given is not None else (
        f"was taken from the first {len(head)} rows: make those carry the wider type (e.g. "
        "1.0, not 1), or give write_dataset a schema=")

    def gen() -> Iterator[pa.RecordBatch]:
        done = 0
        chunk = head
        while chunk:
            if done:
                _check_keys(chunk, names, done, whose)
            if done == 0 and inferred_head is not None:
                yield from inferred_head.to_batches()
            else:
                yield from _convert(chunk, schema, done, source,
                                    asked=given is not None).to_batches()
            done += len(chunk)
            chunk = list(itertools.islice(rows, chunk_rows))

    return schema, gen()


def _convert(chunk: list[dict[str, Any]], schema: pa.Schema, done: int,
             source: str, *, asked: bool) -> pa.Table:
    """Rows ``done ..`` as ``schema``'s types, or the DataError naming the column that does
    not fit them (``source``: where those types came from, and what to do). ``asked``:
    ``schema`` was given (``schema=``), and floats are rounded into it, as :func:`conform`
    does; the first rows' types take them only as they are."""
    try:  # every column inferred at once; one that fails is found and named below
        inferred = pa.Table.from_struct_array(pa.array(chunk))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
        inferred = None  # (uuid.UUID values: no struct of extension types)
    columns = []
    for field in schema:
        try:
            columns.append(_column(chunk, field, inferred, asked=asked))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                OverflowError) as exc:
            raise DataError(
                f"rows {done}..{done + len(chunk) - 1}, column {field.name!r}: {exc}; "
                f"its type, {field.type}, {source}"
            ) from exc
    return _not_null(pa.Table.from_arrays(columns, schema=schema),
                     f"rows {done}..{done + len(chunk) - 1}")


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
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        column = None  # no one type holds them as they are (ints past int64)
    if column is not None and column.type == field.type:
        if not guess_kept(values(), column):  # (pyarrow's guess: a date for a datetime)
            raise pa.ArrowInvalid(f"pyarrow's guess changes its values ({_kinds(values())})")
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


# Types pyarrow guesses from mixed Python values by changing some: a datetime among dates
# loses its time of day, a naive one among aware ones is taken for UTC (and the reverse drops
# the zone), a str among bytes becomes bytes, an int among timedeltas microseconds. (It
# refuses an int past 2**53 among floats itself.)
_GUESSED = (pa.types.is_date, pa.types.is_timestamp, pa.types.is_time, pa.types.is_duration,
            pa.types.is_binary, pa.types.is_large_binary)


def _is_guessed(t: pa.DataType) -> bool:
    return any(test(t) for test in _GUESSED)


def guess_kept(values: list[Any], column: pa.Array | pa.ChunkedArray, *,
               uniform: bool | None = None) -> bool:
    """Whether ``column``, pyarrow's conversion of Python ``values``, holds those values.
    ``uniform``: whether the values its type was guessed from were of one kind (None: these
    values are those)."""
    if not holds(column.type, _is_guessed):
        return True
    if _one_kind_each(values) if uniform is None else uniform:  # nothing mixed to change:
        return True  # 7x cheaper than comparing them
    return same_values(values, column.to_pylist(), column.type)


def _one_kind_each(values: list[Any]) -> bool:
    """Whether the values at each place (top level, a struct's field, a list's items) are of
    one kind (type, and naive or aware), none of those pyarrow changes alone (a pandas
    Timestamp's nanoseconds, an aware time's zone)."""
    kinds = set(map(type, values))
    kinds.discard(type(None))
    if not any(issubclass(k, (dict, list, tuple)) for k in kinds):  # flat: the common case
        if len(kinds) != 1 or not hasattr(next(iter(kinds)), "tzinfo"):
            return len(kinds) <= 1  # dates, bytes, timedeltas: no zone, nothing else to lose
        kind, present = next(iter(kinds)), [v for v in values if v is not None]
        zones = {v.tzinfo is None for v in present}
        if issubclass(kind, datetime.time):
            return zones == {True}  # an aware time loses its zone
        if hasattr(kind, "nanosecond"):  # pandas Timestamps: written in microseconds
            return len(zones) == 1 and not any(v.nanosecond for v in present)
        return len(zones) == 1
    seen: dict[tuple[Any, ...], tuple[type, bool]] = {}
    stack: list[tuple[tuple[Any, ...], Any]] = [((), v) for v in values]
    while stack:
        place, v = stack.pop()
        if v is None:
            continue
        if isinstance(v, dict):
            stack.extend(((*place, k), x) for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend(((*place, None), x) for x in v)
        else:
            leaf = (type(v), getattr(v, "tzinfo", None) is None)
            if _alone_changed(v) or seen.setdefault(place, leaf) != leaf:
                return False
    return True


def _alone_changed(v: Any) -> bool:
    """A value pyarrow changes even among its own kind: a pandas Timestamp's nanoseconds
    (written in microseconds), an aware time of day (Arrow's times have no zone)."""
    return bool(getattr(v, "nanosecond", 0)) or (
        isinstance(v, datetime.time) and v.tzinfo is not None)


def _kinds(values: list[Any]) -> str:
    kinds = []
    for v in values:
        kind = type(v).__name__ + (" with a time zone" if getattr(v, "tzinfo", None) else "")
        if v is not None and kind not in kinds:
            kinds.append(kind)
    return ", ".join(kinds)


def _which(rows: list[dict[str, Any]]) -> str:
    """``, column 'x'``: the first whose values alone do not convert (an error path only)."""
    for name in rows[0]:
        try:
            pa.array([row.get(name) for row in rows])
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            return f", column {name!r}"
    return ""


def as_batches(
    data: Any, chunk_rows: int, schema: pa.Schema | None = None
) -> tuple[pa.Schema, Iterator[pa.RecordBatch], int | None]:
    """Normalise any supported input to (schema, stream of record batches, rows if known).

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
    found, batches, total = _as_batches(data, chunk_rows, schema)
    return schema or found, batches, total


def _as_batches(
    data: Any, chunk_rows: int, given: pa.Schema | None
) -> tuple[pa.Schema, Iterator[pa.RecordBatch], int | None]:
    if isinstance(data, pa.Table):
        return data.schema, iter(data.to_batches(max_chunksize=chunk_rows)), data.num_rows
    if isinstance(data, pa.RecordBatch):
        return data.schema, iter([data]), data.num_rows
    if isinstance(data, pa.RecordBatchReader):
        return data.schema, iter(data), None
    module = type(data).__module__.split(".")[0]
    if module == "pandas":
        schema, batches = _pandas_batches(data, chunk_rows)
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
            schema, batches = _dict_batches(first, it, chunk_rows, given)
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
