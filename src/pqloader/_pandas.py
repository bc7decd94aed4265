"""pandas DataFrames as one schema and a stream of record batches, their values kept: names
made text, named index levels as columns, pandas' metadata kept, and Python objects whose
kinds pyarrow's guess would change refused (``_mixed.py``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from ._errors import DataError
from ._mixed import checked, guess_kept, kinds_said, one_kind_each

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


def _check_unnamed_index(df: Any) -> None:
    """Refuse an unnamed index level of values other than integers: a time series'
    DatetimeIndex, labels. Left out as positions are, it was lost without a word (found in
    review); named, it is written as a column."""
    import pandas as pd

    for level in range(df.index.nlevels):
        if df.index.names[level] is not None:
            continue
        values = df.index.get_level_values(level)
        if pd.api.types.is_integer_dtype(values.dtype):
            continue  # positions (what df[df.x > 0] leaves): not data
        where = "index" if df.index.nlevels == 1 else f"index level {level}"
        raise DataError(
            f"the DataFrame's {where} is unnamed and holds {values.dtype} values, data "
            "rather than positions, which write_dataset leaves out of unnamed levels: name "
            "it to write it as a column (df.rename_axis('time')), or drop it "
            "(df.reset_index(drop=True))")


def _check_names(df: Any, names: list[str]) -> None:
    """Refuse a named index level that has another level's name, or a column's and other
    values (``set_index(col, drop=False)`` keeps both alike), and a name of the form pandas
    gives unnamed levels (``__index_level_0__``): the level, or the column, was dropped
    without a word (found by a round-trip fuzzer)."""
    for name in [*names, *(str(n) for n in df.index.names if n is not None)]:
        if _UNNAMED_INDEX.fullmatch(name):
            raise DataError(
                f"the DataFrame has a column or index level named {name!r}, the name pandas "
                "gives an unnamed index level, which write_dataset leaves out: rename it "
                f"(df.rename(columns={{{name!r}: 'new_name'}}), or df.rename_axis(...))")
    seen: set[str] = set()
    for level, raw in enumerate(df.index.names):
        if raw is None:
            continue  # a position, left out (_check_unnamed_index)
        name = str(raw)
        alike = name in names and names.count(name) == 1 and _same_arrow(
            df.index.get_level_values(level), df.iloc[:, names.index(name)])
        if name in seen or (name in names and not alike):
            raise DataError(
                f"the DataFrame's index level {name!r} has the name of "
                f"{'another level' if name in seen else 'a column with other values'}; "
                "written beside it, one of the two would be lost: rename the level "
                "(df.rename_axis(...)) or drop it (df.reset_index(drop=True))")
        seen.add(name)


def _same_arrow(level: Any, column: Any) -> bool:
    """Whether an index level and a column write as the same Arrow values and type (pandas'
    ``equals`` took a bool level for an int column of 1s and 0s, and refused an int64 level
    beside an Int64 column of its values: found in review)."""
    try:
        return bool(pa.Array.from_pandas(level).equals(pa.Array.from_pandas(column)))
    except (pa.ArrowException, TypeError, ValueError):
        return False


def pandas_batches(df: Any, chunk_rows: int) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
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
    _check_unnamed_index(df)
    _check_names(df, names)
    try:
        schema = pa.Schema.from_pandas(df, preserve_index=True)
    except (ValueError, TypeError, OverflowError, pa.ArrowNotImplementedError) as exc:
        raise _pandas_error(df, exc, "the DataFrame") from exc
    # pandas' metadata kept: read_parquet gives back the dtypes (Int64, boolean, categories)
    # and the named index; it reads files whose metadata names the unnamed level left out
    schema = pa.schema([f for f in schema if not _UNNAMED_INDEX.fullmatch(f.name)],
                       metadata=schema.metadata)
    # Python values of kinds pyarrow's guess may change (dates beside datetimes, naive beside
    # aware, bytes beside str, bools beside floats), in object columns, categories or named
    # index levels: checked as rows of dicts are
    guessed = [(source, name) for name, source in _untyped(df).items()
               if name in schema.names and checked(schema.field(name).type)]
    # whether each holds values of one kind, over the whole frame: its type was guessed from
    # the whole frame, so a chunk of one kind may still be of another than the type's (dates,
    # then a chunk of datetimes, lost their time; found in review)
    uniform = {name: one_kind_each(_kinds_of(df, source)) for source, name in guessed}

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
                        f"({kinds_said(values)}) as {table.column(name).type}, changing some; "
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
    values = _series(df, source)
    if getattr(values.dtype, "name", None) == "category":
        return list(values.dtype.categories)
    return _python_values(df, source)


def _python_values(chunk: Any, source: tuple[str, int]) -> list[Any]:
    """The values of a column or index level (``source``) as Python objects, pandas'
    missing values (NaN, NaT, pd.NA) as None."""
    values = _series(chunk, source).astype(object)  # a categorical's values, not its codes
    return list(values.where(values.notna(), None).tolist())


def _series(df: Any, source: tuple[str, int]) -> Any:
    """Column ``i`` (``("column", i)``) or index level ``i`` (``("index", i)``) as a Series."""
    kind, i = source
    return df.iloc[:, i] if kind == "column" else df.index.get_level_values(i).to_series()
