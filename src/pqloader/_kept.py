"""The rows a ``filter=`` keeps, counted per row group when a dataset opens (``_filter.py``)."""

from __future__ import annotations

import functools
import itertools
import operator
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from ._conform import partition_columns
from ._discover import Discovery, read_footers
from ._errors import DataError, EmptyDatasetError
from ._filter import has_floats
from ._int96 import READ as INT96
from ._int96 import file_schema
from ._read import FragmentReader
from ._threads import executor

_CHUNK_ROWS = 1 << 20  # rows of row groups a thread counts as one task
_CHUNK_BYTES = 64 << 20  # filter columns tested in one go, at most (and one row group)
_ONE_ROW = "\0row"  # a column that gives a table of partition values its one row


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
        one = pa.table({_ONE_ROW: pa.nulls(1)})  # one row: a table with no columns has none
        per_file = []
        for entry in d.files:
            t = one
            for field, column in partition_columns(entry, parts, 1):
                t = t.append_column(field, column)
            per_file.append(f.apply(t, entry.path).num_rows)
        kept = np.where(np.asarray(per_file, dtype=bool)[d.file_index], d.num_rows, 0)
    else:
        threads = (os.cpu_count() or 1) * (1 if d.store is None else 4)
        with executor(threads, "pqloader-filter") as pool:
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
                   byte_size=(d.byte_size[some] * kept[some]) // d.num_rows[some],
                   read_bytes=d.held()[some])  # a read decodes the whole row group first


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
    without reading it. A footer pyarrow cannot prune from (no statistics) keeps them all,
    and so does a filter that reads a float column, unless NaN makes it false (``nan_false``).
    """
    assert d.filter is not None
    if not d.filter.nan_false and any(has_floats(t) for t in d.filter.schema.types):
        # Parquet's min/max leave NaN out, and pyarrow prunes as if they held every value: a
        # filter true for NaN (~(x <= 0.5), x.is_nan()) lost those rows, pyarrow's own read too
        return np.ones(len(d.num_rows), dtype=bool)
    footers = read_footers(d.files, d.store, d.cache)
    fmt = pads.ParquetFileFormat(read_options=pads.ParquetReadOptions(**INT96))
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
            schema = pa.schema([*file_schema(footer), *d.partition_schema])
            return {rg.id for part in fragment.split_by_row_group(expression, schema=schema)
                    for rg in part.row_groups}
        except (pa.ArrowException, ValueError, TypeError):
            return None

    survivors = list(pool.map(row_groups, range(len(d.files))))
    return np.fromiter((survivors[f] is None or rg in survivors[f]
                        for f, rg in zip(d.file_index.tolist(), d.row_group.tolist(),
                                         strict=True)), dtype=bool, count=len(d.num_rows))


def _count(d: Discovery, probe: FragmentReader, chunk: list[int]) -> np.ndarray:
    """Rows kept in each fragment of ``chunk``: its row groups read in turn and tested a few
    at a time, up to :data:`_CHUNK_BYTES` of filter columns held (a blob column's 1M rows
    were 700 MB)."""
    assert d.filter is not None
    counts: list[int] = []
    held: list[tuple[int, pa.Table]] = []

    def test() -> None:
        assert d.filter is not None
        tables = [t for _, t in held]
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        try:
            keep = d.filter.mask(table, "")
        except DataError:  # which row group: test them one by one, for the error naming it
            for i, t in held:
                d.filter.mask(t, d.where(i))
            raise
        bounds = np.cumsum([0] + [t.num_rows for t in tables])
        counts.extend(int(keep[a:b].sum()) for a, b in itertools.pairwise(bounds))
        held.clear()

    held_bytes = 0  # a running sum: summed anew at each row group, 20,000 row groups of 100
    for i in chunk:  # rows took 222 s to open, 4.4 s for 2,000 (found in review)
        table = probe.read(i)
        held.append((i, table))
        held_bytes += table.nbytes
        if held_bytes >= _CHUNK_BYTES:
            test()
            held_bytes = 0
    if held:
        test()
    return np.asarray(counts, dtype=np.int64)
