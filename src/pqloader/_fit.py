"""Whether a loader's settings fit its dataset, checked as the loader is built: the memory
budget's room for its windows and batches, a shuffle window that mixes row groups, and
columns whose nulls no batch could hold."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ._config import LoaderConfig, bytes_per_row
from ._errors import DataError, InvalidArgumentError, user_stacklevel
from ._memory import RESERVE_BYTES, WINDOWS_PER_STREAM, window_bytes
from ._sizes import statistics

if TYPE_CHECKING:
    from ._dataset import ParquetDataset


def check_room(dataset: ParquetDataset, config: LoaderConfig, streams: int) -> None:
    """Fail early when the budget cannot hold the smallest windows (one row group each), or
    the window or batch the user set (they were taken as given, and the budget broken 3-6x)."""
    d = dataset._discovery
    budget_bytes = config.memory_budget_bytes
    assert budget_bytes is not None
    held = d.held()  # a read holds a whole row group, also the rows a filter then drops
    largest = int(held.argmax()) if len(held) else 0
    need = RESERVE_BYTES + WINDOWS_PER_STREAM * streams * int(held[largest]) \
        if len(held) else 0
    if budget_bytes < need:
        path = d.files[int(d.file_index[largest])].path
        raise InvalidArgumentError(
            f"memory_budget_bytes={budget_bytes:,} cannot hold {streams} worker stream(s) of "
            f"up to {WINDOWS_PER_STREAM} shuffle windows each, a window being at least one row "
            f"group ({int(held[largest]):,} bytes decoded for {path} row group "
            f"{int(d.row_group[largest])}), with {RESERVE_BYTES:,} bytes for the rest (threads, "
            f"batches, Arrow's pool): give at least {need:,} bytes"
            f"{', fewer num_workers' if streams > 1 else ''}, or write smaller row groups "
            "(write_dataset(row_group_size=...))"
        )
    room = window_bytes(budget_bytes, streams)
    per_row = bytes_per_row(d.num_rows, d.byte_size)
    fewer = ", a larger budget, or fewer num_workers" if streams > 1 else " or a larger budget"
    for name in ("shuffle_window_rows", "batch_size"):
        rows = getattr(config, name)
        if rows is not None and rows * per_row > room:
            raise InvalidArgumentError(
                f"{name}={rows:,} is ~{int(rows * per_row):,} bytes decoded, more than the "
                f"{room:,} that memory_budget_bytes={budget_bytes:,} leaves a shuffle window "
                f"of each of {streams} worker stream(s): give {name} at most "
                f"{max(1, int(room // per_row)):,}{fewer}")  # (fewer: where there are more)


def warn_unmixed(dataset: ParquetDataset, config: LoaderConfig, window_rows: int) -> None:
    """Warn when the automatic shuffle window holds no more than one of the dataset's typical
    row groups: the shuffle then only permutes rows within each row group, and rows of
    different files never meet in a batch (row groups of 64 MiB or more, as images written
    with 65,536-row groups make; found in review: batches spanned 1.0-1.1 files)."""
    d = dataset._discovery
    if len(d.num_rows) < 2:
        return
    typical = int(np.median(d.num_rows))
    if window_rows > typical or typical < 2:  # row groups of one row: a window is one row,
        return  # and shuffling row groups is shuffling rows
    example = int(np.argmin(np.abs(d.num_rows - typical)))
    window_mib = window_rows * bytes_per_row(d.num_rows, d.byte_size) / 2**20
    budget = "" if config.memory_budget_bytes is None else (
        f", as memory_budget_bytes={config.memory_budget_bytes:,} leaves it")
    warnings.warn(
        f"shuffle=True permutes the rows of one row group at a time here: the shuffle window "
        f"of ~{window_rows:,} rows (~{window_mib:,.1f} MiB decoded{budget}) holds no more than "
        f"one of this dataset's row groups, which hold ~{typical:,} rows (e.g. "
        f"{d.where(example)}, ~{int(d.byte_size[example]) / 2**20:,.1f} MiB decoded), so rows of "
        "different row groups and files never meet in a batch; "
        "write the dataset with smaller row groups (write_dataset(row_group_size=...)), or "
        "give shuffle_window_rows= (memory grows with it)", UserWarning,
        stacklevel=user_stacklevel())


def check_nulls(dataset: ParquetDataset) -> None:
    """Fail as the loader is built when the footers' statistics (or the hive folders) say a
    column of ints, bools or times holds nulls, which no batch of tensors can hold: found by
    the batch holding the first, it stopped a run 490 batches in (found in review). Only the
    footers at hand are read (a dataset opened from its manifest has none until it reads), and
    not under a filter, which may drop those rows."""
    d = dataset._discovery
    if d.filter is not None:
        return
    parts = set(d.partition_schema.names)
    file_rows = np.bincount(d.file_index, weights=d.num_rows, minlength=len(d.files))
    for field in d.schema:
        t = field.type
        if not (pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_temporal(t)):
            continue
        nulls, first, leaf = 0, None, None
        for i, entry in enumerate(d.files):
            if field.name in parts:
                if dict(entry.partition).get(field.name, "") is None and file_rows[i]:
                    nulls += int(file_rows[i])  # (a file of no rows there holds no null)
                    first = first or (entry.path, "row group 0")  # (its folder's)
                continue
            md = entry.metadata
            if md is None:
                continue
            if leaf is None or leaf >= md.num_columns or \
                    md.schema.column(leaf).path != field.name:  # (files alike: found once)
                leaf = next((i for i in range(md.num_columns)
                             if md.schema.column(i).path == field.name), None)
                if leaf is None:
                    continue
            leaf_type = md.schema.column(leaf).physical_type
            for rg in range(md.num_row_groups):
                stats = statistics(md.row_group(rg).column(leaf), leaf_type)
                if stats is not None and stats.has_null_count and stats.null_count:
                    nulls += stats.null_count
                    first = first or (entry.path, f"row group {rg}")
        if first is not None:
            raise DataError(
                f"column {field.name!r} ({t}) has null values ({nulls:,} by the footers' "
                f"statistics, the first in {first[0]}: {first[1]}), which no batch of tensors "
                "can hold; fill them when writing, "
                + ("cast the column to float (nulls become NaN), " if pa.types.is_integer(t)
                   else "")
                + "or leave it out with columns=[...] or convert it yourself with collate_fn=")
