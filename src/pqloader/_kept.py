"""The rows a ``filter=`` keeps, counted per row group when a dataset opens (``_filter.py``)."""

from __future__ import annotations

import functools
import operator
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from ._discover import Discovery, read_footers
from ._errors import DataError, EmptyDatasetError
from ._read import FragmentReader, partition_columns

_CHUNK_ROWS = 1 << 20  # rows of row groups whose filter columns are tested in one go
_FRAGMENT = "\0fragment"  # the column that tells the row groups of a chunk apart


def count_kept(d: Discovery) -> Discovery:
    """The index of the rows ``d.filter`` keeps: each row group's count, the empty ones gone.

    Row groups whose statistics rule the filter out count 0 unread (:func:`_may_match`). The
    filter's columns of the others are read once, in parallel, and tested a chunk of row
    groups at a time (pyarrow evaluates an expression through a query plan, ~0.4 ms a call:
    per row group that was 40% of the time to open W1). A filter of hive partition columns
    only is decided per file from its folders, and reads nothing.
    """
    assert d.filter is not None
    f = d.filter
    parts = [d.partition_schema.field(n) for n in f.columns if n in d.partition_schema.names]
    if len(parts) == len(f.columns):
        one = pa.table({_FRAGMENT: pa.nulls(1)})  # one row: a table with no columns has none
        per_file = []
        for entry in d.files:
            t = one
            for field, column in partition_columns(entry, parts, 1):
                t = t.append_column(field, column)
            per_file.append(f.apply(t, entry.path).num_rows)
        kept = np.where(np.asarray(per_file, dtype=bool)[d.file_index], d.num_rows, 0)
    else:
        threads = (os.cpu_count() or 1) * (1 if d.store is None else 4)
        with ThreadPoolExecutor(threads, thread_name_prefix="pqloader-filter") as pool:
            maybe = _may_match(d, pool)
            # the filter's columns, read as if they were the dataset's: every row of each group
            probe = FragmentReader(replace(d, schema=f.schema, filter=None))
            chunks = _chunks(np.flatnonzero(maybe), d.num_rows)
            kept = np.zeros(len(d.num_rows), dtype=np.int64)
            for chunk, counts in zip(chunks, pool.map(lambda c: _count(d, probe, c), chunks),
                                     strict=True):
                kept[chunk] = counts
    some = kept > 0
    if not some.any():  # a typo in a value ("tset") would train on nothing, unseen
        raise EmptyDatasetError(
            f"filter {f.text} keeps none of the {int(d.num_rows.sum()):,} rows of "
            f"{len(d.files)} files; check its values against the data")
    return replace(d, file_index=d.file_index[some], row_group=d.row_group[some],
                   num_rows=kept[some],
                   byte_size=(d.byte_size[some] * kept[some]) // d.num_rows[some])


def _chunks(fragments: np.ndarray, num_rows: np.ndarray) -> list[list[int]]:
    """``fragments`` in runs of about :data:`_CHUNK_ROWS` rows."""
    out: list[list[int]] = [[]]
    rows = 0
    for i in fragments.tolist():
        if rows >= _CHUNK_ROWS:
            out.append([])
            rows = 0
        out[-1].append(i)
        rows += int(num_rows[i])
    return out if out[0] else []


def _may_match(d: Discovery, pool: ThreadPoolExecutor) -> np.ndarray:
    """Per fragment: whether its row group's statistics leave room for a row the filter keeps.

    pyarrow's own pruning (what ``pyarrow.dataset`` does before it reads) from the footers
    already read: a row group whose min/max/null counts rule the filter out is counted 0
    without reading it. A footer pyarrow cannot prune from (no statistics) keeps them all.
    """
    assert d.filter is not None
    footers = read_footers(d.files, d.store, d.cache)
    fmt = pads.ParquetFileFormat()
    expression = d.filter.expression

    def row_groups(i: int) -> set[int] | None:  # those that may match; None: all of them
        entry, footer = d.files[i], footers[i]
        values = [(field.name, column[0].as_py()) for field, column in
                  partition_columns(entry, list(d.partition_schema), 1)]
        known = [pc.field(k) == v if v is not None else pc.field(k).is_null() for k, v in values]
        guarantee = functools.reduce(operator.and_, known, pc.scalar(True))  # its folders
        try:
            sink = pa.BufferOutputStream()
            footer.write_metadata_file(sink)  # the footer alone: a Parquet file of no data
            fragment = fmt.make_fragment(pa.BufferReader(sink.getvalue()),
                                         partition_expression=guarantee)
            schema = pa.schema([*footer.schema.to_arrow_schema(), *d.partition_schema])
            return {rg.id for part in fragment.split_by_row_group(expression, schema=schema)
                    for rg in part.row_groups}
        except (pa.ArrowException, ValueError, TypeError):
            return None

    survivors = list(pool.map(row_groups, range(len(d.files))))
    return np.fromiter((survivors[f] is None or rg in survivors[f]
                        for f, rg in zip(d.file_index.tolist(), d.row_group.tolist(),
                                         strict=True)), dtype=bool, count=len(d.num_rows))


def _count(d: Discovery, probe: FragmentReader, chunk: list[int]) -> np.ndarray:
    """Rows kept in each fragment of ``chunk``."""
    assert d.filter is not None
    tables = [probe.read(i) for i in chunk]
    sizes = [t.num_rows for t in tables]
    tagged = pa.concat_tables(tables).append_column(
        _FRAGMENT, pa.array(np.repeat(np.arange(len(chunk), dtype=np.int32), sizes)))
    try:
        kept = d.filter.apply(tagged, "")
    except DataError:  # which row group: test them one by one, for the error that names it
        for i, table in zip(chunk, tables, strict=True):
            d.filter.apply(table, d.where(i))
        raise
    return np.bincount(kept[_FRAGMENT].to_numpy(), minlength=len(chunk)).astype(np.int64)
