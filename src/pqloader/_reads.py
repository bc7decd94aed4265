"""A worker's segments as the reads it makes: an old plan's windows cut to this plan's size,
and row groups emitted in order (unshuffled) joined in reads of a few MiB."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from ._plan import Segment, Window, whole
from ._slices import Slice

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
    group: list[Slice] = []
    rows = size = 0

    def close() -> None:
        nonlocal group, rows, size
        if group:
            out.append(whole(Window(tuple(group), None)))
            group, rows, size = [], 0, 0

    for segment in segments:
        if segment.window.key is not None:
            close()
            out.append(segment)
            continue
        for piece in _slices_of(segment):
            group.append(piece)
            rows += piece.num_rows
            size += int(held[piece.fragment])
            if size >= IN_ORDER_BYTES or (window_rows > 0 and rows >= window_rows):
                close()
    close()
    return out


def _slices_of(segment: Segment) -> Iterator[Slice]:
    """The slices holding an in-order segment's rows (its window's rows [start, stop))."""
    at = 0
    for s in segment.window.slices:
        lo, hi = max(segment.start - at, 0), min(segment.stop - at, s.num_rows)
        if lo < hi:
            yield Slice(s.fragment, s.start + lo, s.start + hi)
        at += s.num_rows


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
        piece = max(window_rows, max(s.num_rows for s in window.slices))
        out.extend(Segment(window, a, min(a + piece, segment.stop))
                   for a in range(segment.start, segment.stop, piece))
    return out
