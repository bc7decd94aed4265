"""Where a batch's or a window's rows come from, told in errors: the files and row groups."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ._plan import Window
from ._slices import Slice

if TYPE_CHECKING:
    from ._discover import Discovery

_NAMED = 8  # row groups an error names (a read may join thousands)


def rows_from(discovery: Discovery, parts: Sequence[tuple[Window, int, int]],
              row: int | None = None) -> str:
    """The row groups a batch's rows were read from, for a collate_fn's or a transform's
    error: ``parts`` are (window, start, stop), positions in the window's emission order
    (its permutation, made again here: errors are rare). ``row``: that row's alone."""
    said = "its rows are from "
    if row is not None:
        for window, start, stop in parts:
            if row < stop - start:
                parts, said = [(window, start + row, start + row + 1)], "it is from "
                break
            row -= stop - start
    try:
        named: dict[Slice, None] = {}
        for window, start, stop in parts:
            rows = window.order()[start:stop]
            found = np.searchsorted(window.starts(), rows, side="right") - 1
            for k in np.unique(found).tolist():
                named[window.slices[k]] = None
    except Exception:  # a note must not hide the error it notes
        return ""
    if not named:
        return ""
    return "; " + said + _named(discovery, sorted(named, key=lambda s: (s.fragment, s.start)))


def describe(discovery: Discovery, window: Window, column: pa.ChunkedArray | None = None
             ) -> str:
    """The files and row groups a window reads, for error messages: those holding the
    nulls of ``column`` (of the window, read order) when it has any, else its uint64
    values past int64's (every row group was named: found in review)."""
    slices: Sequence[Slice] = window.slices
    try:
        if column is not None and (faults := _nulls if _nulls(column) else
                                   _past_int64)(column):
            slices = tuple(s for s, at in zip(slices, window.starts().tolist(),
                                              strict=False)
                           if faults(column.slice(at, s.num_rows))) or slices
    except Exception:  # a note must not hide the error it notes
        slices = window.slices
    return _named(discovery, slices)


def _named(discovery: Discovery, slices: Sequence[Slice]) -> str:
    """The files and row groups of ``slices``: ``_NAMED`` of them, then how many more."""
    named = "; ".join(discovery.where(s.fragment) for s in slices[:_NAMED])
    return named + (f"; and {len(slices) - _NAMED:,} row groups more"
                    if len(slices) > _NAMED else "")


def _nulls(column: pa.ChunkedArray) -> int:
    """The nulls a column's error is about: its own, and those in its lists' values (a null
    list of variable length is no error: a row of length 0)."""
    t = column.type
    inside = sum(int(c.flatten().null_count) for c in column.chunks) \
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) \
        else 0
    own = 0 if pa.types.is_list(t) or pa.types.is_large_list(t) else int(column.null_count)
    return own + inside


def _past_int64(column: pa.ChunkedArray) -> int:
    """A uint64 column's values (or its lists') past int64's range."""
    t = column.type
    listed = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    if (t.value_type if listed else t) != pa.uint64():
        return 0
    values = [pc.list_flatten(c) if listed else c for c in column.chunks]
    most = pa.scalar(2**63 - 1, pa.uint64())
    return sum(int(pc.sum(pc.greater(v, most)).as_py() or 0) for v in values)
