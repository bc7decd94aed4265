"""A row group's table as read, made the dataset's: its hive folders' values added, the
filter applied, its rows counted against the index, its columns in the dataset's order and
types (or an error naming the file and row group, and why)."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from ._discover import Discovery, FileEntry
from ._errors import DataError, SchemaMismatchError

CHANGED = ("the file changed since the dataset was opened, or since the manifest that "
           "opened it was written (it matches files by name and size only): open the "
           "dataset again, and delete a stale _pqloader_manifest.json")


def conform(d: Discovery, fragment: int, table: pa.Table, partitions: Sequence[pa.Field]
            ) -> pa.Table:
    """Fragment ``fragment``'s rows as read (its file's columns, views already cast), as the
    dataset holds them; ``partitions``: the hive columns the read wants."""
    entry = d.files[int(d.file_index[fragment])]
    where = f"{entry.path}: row group {int(d.row_group[fragment])}"
    for field, column in partition_columns(entry, partitions, table.num_rows):
        table = table.append_column(field, column)
    if d.filter is not None:
        table = d.filter.apply(table, where)
    expected = int(d.num_rows[fragment])
    if table.num_rows != expected:  # else rows would be lost or repeated, unseen
        kept = "" if d.filter is None else " kept by the filter"
        raise SchemaMismatchError(
            f"{where} holds {table.num_rows} rows{kept}, the dataset's index {expected}; "
            f"{CHANGED}")
    try:
        if table.schema.names != d.schema.names:
            table = table.select(d.schema.names)
        if not table.schema.equals(d.schema):
            table = table.cast(d.schema)
    except (pa.ArrowException, KeyError, ValueError) as exc:
        raise _misfit(where, table, d.schema, exc) from exc
    return table


def _misfit(where: str, table: pa.Table, schema: pa.Schema, exc: Exception) -> Exception:
    """Why ``table`` does not cast to the dataset's ``schema``: values of a column that do
    not fit the type other files gave it (timestamps past 2262 in ns beside files in ns), or
    else a file changed since the dataset was opened."""
    for field in schema:
        i = table.schema.get_field_index(field.name)
        if i < 0 or table.schema.field(i).type.equals(field.type):
            continue
        try:
            table.column(i).cast(field.type)
        except pa.ArrowInvalid as bad:
            return DataError(
                f"{where}, column {field.name!r}: its {table.schema.field(i).type} values do "
                f"not fit the dataset's {field.type}, the type other files give it ({bad}); "
                "rewrite the files in one type, or read these files apart")
        except pa.ArrowException:
            break
    return SchemaMismatchError(f"{where} does not fit the dataset's schema ({exc}); {CHANGED}")


def partition_columns(entry: FileEntry, fields: Sequence[pa.Field], num_rows: int
                      ) -> list[tuple[pa.Field, pa.Array]]:
    """A file's hive partition values, typed, as ``num_rows`` long columns."""
    values = dict(entry.partition)
    out = []
    for field in fields:
        raw = values[field.name]
        value = int(raw) if raw is not None and pa.types.is_integer(field.type) else raw
        out.append((field, pa.repeat(pa.scalar(value, field.type), num_rows)))
    return out
