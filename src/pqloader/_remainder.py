"""Elastic resume: what an old plan's ranks had not delivered, dealt to a new world.

A state saved under other settings (world size, batch size, workers) resumes by taking what
every old (rank, worker) had not yet delivered, as segments of the old windows
(:func:`remaining`), each row once, and dealing those rows to the new ranks and workers as a
fresh epoch deals row groups (:func:`plan_remainder`). The windows keep their permutations,
so no delivered row can come back. Pure, like ``_plan.py``: no IO, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._plan import (
    RankPlan,
    Segment,
    Window,
    WorkerPlan,
    advance,
    deal_rows,
    walk,
    whole,
)


def remaining(old: list[RankPlan], batches_done: int) -> list[Segment]:
    """What every rank of an old plan had not delivered after ``batches_done`` batches each.

    In (rank, worker) order: one sequence that :func:`plan_remainder` deals out again. Rows
    the old world repeated to pad its ranks even (``drop_last=False``) appear once, and not at
    all when delivered already: the new world pads for itself, and carrying the old padding
    too repeated up to (old ranks - 1) more rows than the contract allows.
    """
    delivered: list[Segment] = []
    left: list[Segment] = []
    for plan in old:
        n = len(plan.workers)
        for wp in plan.workers:
            done = wp.batch_sizes[:len(range(wp.worker, batches_done, n))].total()
            delivered.extend(_first(wp.segments, done))
            left.extend(advance(wp.segments, done))
    # a remainder's padding repeats positions of its windows; a fresh epoch's, rows of its
    # first windows in windows of its own: both kinds are dropped
    seen: dict[Window, list[tuple[int, int]]] = {}
    for segment in delivered:
        _unseen(segment, seen)
    left = [piece for segment in left for piece in _unseen(segment, seen)]
    return _rows_once(delivered, left)


def own_remaining(plan: RankPlan, batches_done: int) -> list[Segment]:
    """What one rank of an old plan had not delivered after ``batches_done`` batches, its
    padding included, in worker order: for a resume in the same world size and batch size,
    where each rank deals out its own rows again. A rank that resumes exactly (its settings
    unchanged) goes on with the same rows, so the two kinds of rank agree; the padding is the
    old plan's, as delivered without the resume (found in review: with the rows of every rank
    dealt anew, a rank that changed ``num_workers`` took a share shifted by the padding of
    another, beside ranks that resumed exactly: a row lost, another repeated)."""
    n = len(plan.workers)
    return [segment for wp in plan.workers for segment in advance(
        wp.segments, wp.batch_sizes[:len(range(wp.worker, batches_done, n))].total())]


_ROW_BITS = 40  # a row's id: fragment << _ROW_BITS | row in the fragment


def _rows_once(delivered: list[Segment], left: list[Segment]) -> list[Segment]:
    """``left`` without the rows that another window holds too (a fresh epoch's padding):
    each once, and none that ``delivered`` holds. Only windows that share rows are permuted."""
    shared = shared_windows(list({s.window for s in (*delivered, *left)}))
    if not shared:
        return left
    emitted: dict[Window, np.ndarray] = {}

    def rows(segment: Segment) -> np.ndarray:
        w = segment.window
        if w not in emitted:
            ids = np.concatenate([(sl.fragment << _ROW_BITS) + np.arange(sl.start, sl.stop)
                                  for sl in w.slices])
            emitted[w] = ids[w.order()]
        return emitted[w][segment.start:segment.stop]

    # Kept: a row's first time in the delivered rows, then the rows left, in order (with
    # np.unique, not a set in a Python loop: 3.8 s for 4M-row windows, found in review).
    before = [rows(s) for s in delivered if s.window in shared]
    after = [rows(s) for s in left if s.window in shared]
    every = np.concatenate(before + after)
    _, first, inverse = np.unique(every, return_index=True, return_inverse=True)
    keeps = iter(np.split(first[inverse.reshape(-1)] == np.arange(len(every)),
                          np.cumsum([len(r) for r in before + after]))[len(before):])
    out: list[Segment] = []
    for segment in left:
        if segment.window not in shared:
            out.append(segment)
            continue
        keep = next(keeps)
        edges = np.flatnonzero(np.diff(np.concatenate([[0], keep.view(np.int8), [0]])))
        out.extend(Segment(segment.window, segment.start + int(a), segment.start + int(b))
                   for a, b in zip(edges[::2], edges[1::2], strict=True))
    return out


def shared_windows(windows: list[Window]) -> set[Window]:
    """The windows that hold a row another of ``windows`` holds too. Each row group's slices
    in order of (start, stop): one that starts before the furthest stop so far, of another
    window than the one that reached it, overlaps it. With arrays (a loop over the slices of
    an elastic resume of 1M row groups took seconds)."""
    if len(windows) < 2:
        return set()
    held = [w.arrays for w in windows]
    fragment, start, stop = (np.concatenate([getattr(h, name) for h in held])
                             for name in ("fragments", "starts", "stops"))
    if not len(stop):
        return set()
    window = np.repeat(np.arange(len(windows)), [len(h) for h in held])
    by = np.lexsort((stop, start, fragment))
    fragment, start, stop, window = fragment[by], start[by], stop[by], window[by]
    dense = np.unique(fragment, return_inverse=True)[1].reshape(-1)  # each row group's own
    bits = int(stop.max()).bit_length()  # a row group's stops below 2**bits
    reach = np.maximum.accumulate((dense << bits) | stop)  # the furthest stop so far (a row
    # group's first slice passes every earlier one: its number is larger)
    rose = np.concatenate([[True], reach[1:] > reach[:-1]])
    holder = window[np.maximum.accumulate(np.where(rose, np.arange(len(rose)), 0))]
    mask = (1 << bits) - 1
    overlaps = np.flatnonzero((dense[1:] == dense[:-1]) & (start[1:] < (reach[:-1] & mask))
                              & (window[1:] != holder[:-1])) + 1
    return {windows[int(k)] for k in {*window[overlaps].tolist(),
                                        *holder[overlaps - 1].tolist()}}


def _first(segments: tuple[Segment, ...], rows: int) -> list[Segment]:
    """The segments of the first ``rows`` rows (what :func:`advance` leaves out)."""
    out = []
    for segment in segments:
        if rows <= 0:
            break
        take = min(rows, segment.num_rows)
        out.append(Segment(segment.window, segment.start, segment.start + take))
        rows -= take
    return out


def _unseen(segment: Segment, seen: dict[Window, list[tuple[int, int]]]) -> list[Segment]:
    """The parts of ``segment`` whose rows ``seen`` does not hold yet; they are added to it.

    ``seen`` maps a window to the sorted, disjoint ranges of its positions met so far.
    """
    ranges = seen.setdefault(segment.window, [])
    out, at = [], segment.start
    for a, b in ranges:
        if b <= at:
            continue
        if a >= segment.stop:
            break
        if a > at:
            out.append(Segment(segment.window, at, a))
        at = max(at, b)
    if at < segment.stop:
        out.append(Segment(segment.window, at, segment.stop))
    merged = sorted([*ranges, *((p.start, p.stop) for p in out)])
    ranges[:] = []
    for a, b in merged:
        if ranges and a <= ranges[-1][1]:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], b))
        else:
            ranges.append((a, b))
    return out


def recut(segments: list[Segment], window_rows: int) -> list[Segment]:
    """``segments`` with each whole shuffled window that ``window_rows`` would not have made
    (an old plan's larger windows) cut into windows of consecutive slices of at least
    ``window_rows`` rows, as a fresh epoch cuts them, each with a key of its own.

    A resume with smaller windows (a memory budget, a smaller ``shuffle_window_rows`` after
    running out of memory) then reads windows of its own size for the rest of the epoch, not
    the old ones; rows mix inside the smaller windows only. Part of a window (the one an old
    worker was in) is left as it is, its rows spread over every slice of it: the pipeline
    reads it in pieces (``_reads.bounded``).
    """
    out: list[Segment] = []
    for segment in segments:
        window = segment.window
        whole_window = (segment.start, segment.stop) == (0, window.num_rows)
        if window.key is None or window_rows < 1 or not whole_window or \
                window.num_rows - window.slices[-1].num_rows < window_rows:
            out.append(segment)
            continue
        held = window.arrays
        ends = np.cumsum(held.rows())  # rows up to and with each slice
        i, part = 0, 1
        while i < len(held):  # each part closes on the slice that brings it to window_rows
            j = int(np.searchsorted(ends, (ends[i - 1] if i else 0) + window_rows)) + 1
            out.append(whole(Window(held[i:min(j, len(held))], (*window.key, part))))
            i, part = j, part + 1
    return out


def rank_share(segments: list[Segment], *, batch_size: int, rank: int, world_size: int,
               drop_last: bool) -> list[Segment]:
    """Rank ``rank``'s share of ``segments`` (every old rank's rows left), as a fresh epoch
    deals rows to ranks, padding included: to be cut to this rank's window size and dealt to
    its workers after. Cut first, as before, a rank of another window size (a node of other
    cores under ``memory_budget_bytes``) took its share of another order: rows lost, others
    repeated (found in review)."""
    deal = deal_rows(sum(s.num_rows for s in segments), batch_size=batch_size, rank=rank,
                     world_size=world_size, num_workers=1, drop_last=drop_last)
    _, _, begin, end = deal.workers[0]
    return list(_cut(segments, begin, end))


def plan_remainder(
    segments: list[Segment],
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    num_workers: int,
    drop_last: bool,
    first_position: int,
) -> RankPlan:
    """Deal the rows of ``segments`` to ranks and workers, as a fresh epoch deals row groups."""
    deal = deal_rows(sum(s.num_rows for s in segments), batch_size=batch_size, rank=rank,
                     world_size=world_size, num_workers=num_workers, drop_last=drop_last)
    plans = [WorkerPlan(w, _cut(segments, begin, end), sizes, positions)
             for w, (positions, sizes, begin, end) in enumerate(deal.workers)]
    return RankPlan(deal.num_batches, tuple(plans), first_position)


def _cut(segments: list[Segment], begin: int, end: int) -> tuple[Segment, ...]:
    """The rows at positions ``[begin, end)`` of ``segments`` (past their total: the first
    again, the padding)."""
    bounds = np.concatenate([[0], np.cumsum([s.num_rows for s in segments], dtype=np.int64)])
    _, items, offsets, takes = (a.tolist() for a in walk(begin, end, bounds))
    return tuple(
        Segment(segments[i].window, segments[i].start + off, segments[i].start + off + n)
        for i, off, n in zip(items, offsets, takes, strict=True)
    )


def dealt_origin(origin: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """``origin`` (an old plan's settings and cursor) to be dealt out under ``current``: the
    old windows cut to the new size, and with the same ranks and batch size each rank's own
    rows left (beside ranks that resume exactly: ``own_remaining``), else each rank's share
    of them (``rank_share``)."""
    out = {k: v for k, v in origin.items() if k not in ("own", "shares")}
    same = all(origin["settings"][k] == current[k] for k in ("world_size", "batch_size"))
    return {**out, "recut": True, "own" if same else "shares": True}
