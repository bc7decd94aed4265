"""INT96 timestamps (Spark's default, Hive's, Impala's) read in microseconds, not nanoseconds.

pyarrow reads them as ``timestamp[ns]`` unless told otherwise, and an int64 of nanoseconds
holds only the years 1677-2262: ``9999-12-31``, the usual "still valid" end of a row in a
warehouse table, became 1816-03-29 and ``1500-01-01`` 2084-07-20, silently. Microseconds hold
any date, and are Spark's own precision; a nanosecond digit past them (Impala writes some) is
dropped.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ._schema import rebuilt
from ._sizes import arrow_of, leaf_count

READ: dict[str, Any] = {"coerce_int96_timestamp_unit": "us"}  # for pq.ParquetFile and kin


def file_schema(md: pq.FileMetaData) -> pa.Schema:
    """A footer's Arrow schema as pqloader reads the file: its INT96 columns in microseconds."""
    global _LAST
    schema = arrow_of(md)[0]  # the last footer's, where the same: then so is this
    last = _LAST
    if last is not None and last[0] is schema:
        return last[1]
    out = _file_schema(md, schema)
    _LAST = (schema, out)  # (replaced whole, as footers are read in threads; out returned)
    return out


_LAST: tuple[pa.Schema, pa.Schema] | None = None  # (arrow_of's schema, file_schema's)


def _file_schema(md: pq.FileMetaData, schema: pa.Schema) -> pa.Schema:
    # The common cases, fast: no ns timestamp (no INT96 possible), or no int96 in the Parquet
    # schema's text (a column's name may hold it: then the leaves are asked, slower).
    if not any(_has_ns(t) for t in schema.types) or "int96" not in str(md.schema).lower():
        return schema
    fields, leaf = [], 0
    for field in schema:
        n = leaf_count(field.type)
        if _has_ns(field.type) and any(md.schema.column(i).physical_type == "INT96"
                                       for i in range(leaf, leaf + n)):
            field = field.with_type(_in_us(field.type))
        fields.append(field)
        leaf += n
    return pa.schema(fields, metadata=schema.metadata)


def _has_ns(t: pa.DataType) -> bool:
    if pa.types.is_timestamp(t):
        return bool(t.unit == "ns")
    return any(_has_ns(t.field(i).type) for i in range(t.num_fields))


def _in_us(t: pa.DataType) -> pa.DataType:
    """``t`` with its nanosecond timestamps in microseconds, at any depth."""
    return rebuilt(t, lambda u: pa.timestamp("us", u.tz) if pa.types.is_timestamp(u)
                   and u.unit == "ns" else u)
