"""A worker's segments as the reads it makes: an old plan's windows cut to this plan's size,
and row groups emitted in order (unshuffled) joined in reads of a few MiB."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._plan import Segment, Window, whole
from ._slices import Slices

# An unshuffled read joins row groups up to this many decoded bytes (in_order_reads): a
# read's fixed costs (~0.2 ms a row group) are then a few percent of its decoding.
IN_ORDER_BYTES = 4 << 20


def in_order_reads(segments: Sequence[Segment], window_rows: int, held: np.ndarray
                    ) -> Sequence[Segment]:
    """``segments``, runs of those emitted in order (unshuffled) joined in reads of about
    :data:`IN_ORDER_BYTES` decoded (``held``: per row group), ``window_rows`` rows at most.
    An unshuffled plan's windows are one row group each (their order is the rows' own: how
    they are cut moves no row), and read one at a time, an epoch of 1,000-row groups ran at
    0.6x a shuffled one: a read's fixed costs per row group. Joined up to a window's rows, an
    epoch of 65,536-row groups ran 1.4x slower and held 1.6x the memory (a window's copy, a
    window ahead); a few MiB a read leaves those row groups alone."""
    out: list[Segment] = []
    run: list[Slices] = []  # the slices of consecutive in-order segments, read in joined reads
    for segment in segments:
        if segment.window.key is not None:
            out.extend(_joined(run, window_rows, held))
            run = []
            out.append(segment)
        else:
            run.append(_slices_of(segment))
    out.extend(_joined(run, window_rows, held))
    return out


def _joined(run: list[Slices], window_rows: int, held: np.ndarray) -> list[Segment]:
    """``run``'s slices in reads that each close on the slice that brings them to
    :data:`IN_ORDER_BYTES` decoded or to ``window_rows`` rows (found by searchsorted: a loop
    over 200,000 row groups took seconds before an epoch's first batch)."""
    if not run:
        return []
    pieces = run[0] if len(run) == 1 else Slices(*(np.concatenate(
        [getattr(p, name) for p in run]) for name in ("fragments", "starts", "stops")))
    sizes = np.cumsum(held[pieces.fragments])
    rows = np.cumsum(pieces.rows())
    out, i, n = [], 0, len(pieces)
    while i < n:
        j = int(np.searchsorted(sizes, (sizes[i - 1] if i else 0) + IN_ORDER_BYTES))
        if window_rows > 0:
            j = min(j, int(np.searchsorted(rows, (rows[i - 1] if i else 0) + window_rows)))
        j = min(max(j + 1, i + 1), n)
        out.append(whole(Window(pieces[i:j], None)))
        i = j
    return out


def _slices_of(segment: Segment) -> Slices:
    """The slices holding an in-order segment's rows (its window's rows [start, stop))."""
    window = segment.window
    at = window.starts()[:-1]
    lo = np.maximum(segment.start - at, 0)
    held = window.arrays
    hi = np.minimum(segment.stop - at, held.rows())
    keep = lo < hi
    return Slices(held.fragments[keep], (held.starts + lo)[keep], (held.starts + hi)[keep])


def bounded(segments: Sequence[Segment], window_rows: int) -> Sequence[Segment]:
    """``segments``, the parts of windows larger than ``window_rows`` makes (an old plan's
    that a resume with smaller windows found a worker in) cut in pieces of ``window_rows``
    rows, or of the window's largest slice when larger (a window of this plan holds at least
    one), each read on its own (:meth:`Stages._load_part`): memory for a window of this
    plan's size, not the old one's, at the cost of reading the old window's row groups once
    per piece. A whole window is read whole (a state saved before old windows were cut)."""
    if window_rows < 1:
        return segments
    out: list[Segment] = []
    for segment in segments:
        window = segment.window
        if (segment.start, segment.stop) == (0, window.num_rows) or \
                window.num_rows - window.slices[-1].num_rows < window_rows:  # this plan's
            out.append(segment)
            continue
        piece = max(window_rows, int(window.arrays.rows().max()))
        out.extend(Segment(window, a, min(a + piece, segment.stop))
                   for a in range(segment.start, segment.stop, piece))
    return out
