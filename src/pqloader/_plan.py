"""The epoch plan: a pure function from fragments and world to each worker's windows.

No IO and no torch: values in, values out, so property tests can check the invariants across
thousands of worlds.

The plan of one epoch, for one rank:

1. Fragments (row groups) are put in an order: a permutation seeded by ``(seed, epoch)`` when
   shuffling (each purpose's generator its own: ``_seeds.py``), else index order. Their rows,
   in that order, form the epoch's *virtual sequence*.
2. Rank ``r`` takes positions ``[r * per_rank, (r + 1) * per_rank)`` of the sequence. Without
   ``drop_last``, ``per_rank = ceil(rows / world_size)`` and positions past the end wrap to the
   start (at most ``world_size - 1`` rows repeat, as torch's ``DistributedSampler`` pads); with
   it, ``per_rank = rows // world_size``. Every rank has the same number of batches.
3. The rank's batches ``0 .. num_batches - 1`` are dealt to workers round-robin: worker ``w``
   makes batches ``w, w + W, w + 2W, ...``, which is the order torch's DataLoader collects them.
   Each worker reads a contiguous span of the rank's positions, so no row group is decoded twice
   except where a span boundary cuts it.
4. A worker's span is cut into *windows* of whole slices of row groups, at least
   ``window_rows`` rows each, except while the worker starts: its first window holds at most
   ``first_window_slices`` slices, the next twice as many, and so on, so that a dataset of
   many small row groups does not read a whole window of them (thousands of reads) before its
   first batch. A shuffled window is emitted in a permutation seeded by
   ``(seed, epoch, start)``, ``start`` being the window's first virtual position.

A worker reads *segments*: parts ``[start, stop)`` of windows' emission orders (a fresh epoch
reads whole windows). Resuming with another world size or worker count deals what the old
ranks left to the new world as in steps 2 and 3 (``_remainder.py``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from ._seeds import FRAGMENTS, WINDOW, generator
from ._slices import Slice, Slices

# A worker's first shuffle window reads at most this many slices (row groups), the next twice as
# many, ... until windows end at ``window_rows``. Reading a slice costs ~0.2-0.5 ms however
# small it is (open the file, decode a few columns), so a 64 MiB window of 500-row groups cost
# ~2 s before the first batch; 64 slices cost ~20 ms, and still mix more row groups per window
# than the default window of 65,536-row groups does (about 8).
FIRST_WINDOW_SLICES = 64


@dataclass(frozen=True)
class Window:
    """Slices read together and emitted in one permutation (``key is None``: in order).
    ``slices`` is held as :class:`Slices` whatever sequence it is given as."""

    slices: Sequence[Slice]
    key: tuple[int, ...] | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "slices", Slices.of(self.slices))

    @property
    def num_rows(self) -> int:
        return int(self.arrays.rows().sum())

    @property
    def arrays(self) -> Slices:
        """``slices`` as they are held: their fragments, starts and stops as arrays."""
        return self.slices  # type: ignore[return-value]  # made so by __post_init__

    def starts(self) -> np.ndarray:
        """Where each slice's rows begin, numbered as the slices concatenated; the total last."""
        return np.concatenate([[0], np.cumsum(self.arrays.rows())])

    def order(self) -> np.ndarray:
        """The order in which this window's rows (numbered as its slices concatenated) go out."""
        if self.key is None:
            return np.arange(self.num_rows, dtype=np.int64)
        seed, *numbers = self.key
        return generator(WINDOW, seed, *numbers).permutation(self.num_rows)


@dataclass(frozen=True)
class Segment:
    """Rows ``[start, stop)`` of a window's emission order."""

    window: Window
    start: int
    stop: int

    @property
    def num_rows(self) -> int:
        return self.stop - self.start


def whole(window: Window) -> Segment:
    return Segment(window, 0, window.num_rows)


@dataclass(frozen=True)
class BatchSizes(Sequence[int]):
    """A worker's batch sizes, in order: ``batches`` batches of ``size`` rows, but the last of
    ``last``. Held as three numbers: as a tuple, 200M rows in batches of 32 held 289 MiB of
    plan (found in review), which a memory budget counted."""

    size: int
    batches: int
    last: int

    def __len__(self) -> int:
        return self.batches

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> BatchSizes: ...

    def __getitem__(self, i: int | slice) -> int | BatchSizes:
        if isinstance(i, slice):
            picked = range(self.batches)[i]
            if picked.step != 1:
                raise ValueError("BatchSizes slices take every batch (no step)")
            ends = bool(picked) and picked[-1] == self.batches - 1
            return BatchSizes(self.size, len(picked), self.last if ends else self.size)
        k = range(self.batches)[i]  # IndexError past the end, negative indices
        return self.last if k == self.batches - 1 else self.size

    def __iter__(self) -> Iterator[int]:
        if self.batches:
            yield from itertools.repeat(self.size, self.batches - 1)
            yield self.last

    def total(self) -> int:
        """Rows in all these batches."""
        return 0 if not self.batches else self.size * (self.batches - 1) + self.last


@dataclass(frozen=True)
class WorkerPlan:
    """What one worker of one rank does in one epoch."""

    worker: int
    segments: tuple[Segment, ...]
    batch_sizes: BatchSizes  # one per batch this worker makes, in order
    positions: range  # each batch's index in the rank's epoch

    @property
    def num_rows(self) -> int:
        return self.batch_sizes.total()


@dataclass(frozen=True)
class RankPlan:
    """One rank's epoch: its batch count and its workers' plans.

    ``first_position``: batches the rank yielded before this plan took over (a resume with other
    settings); random transforms are keyed by ``first_position + position``.
    """

    num_batches: int
    workers: tuple[WorkerPlan, ...]
    first_position: int = 0


def epoch_rows(num_rows: int, *, world_size: int, drop_last: bool) -> int:
    """Rows one rank reads in an epoch."""
    if drop_last:
        return num_rows // world_size
    return math.ceil(num_rows / world_size)


def num_batches(
    fragment_rows: np.ndarray, *, batch_size: int, world_size: int, drop_last: bool
) -> int:
    """Batches every rank yields in an epoch."""
    per_rank = epoch_rows(int(fragment_rows.sum()), world_size=world_size, drop_last=drop_last)
    if drop_last:
        return per_rank // batch_size
    return math.ceil(per_rank / batch_size)


def fragment_order(num_fragments: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order of fragments in the epoch's virtual sequence."""
    if not shuffle:
        return np.arange(num_fragments, dtype=np.int64)
    return generator(FRAGMENTS, seed, epoch).permutation(num_fragments)


def walk(start: int, stop: int, bounds: np.ndarray
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cover virtual positions ``[start, stop)`` of items with first positions ``bounds``.

    Returns the pieces as four arrays: position, item, offset in the item, rows; positions
    past the total wrap to the start (the padding of step 2). Items of no rows make none.
    """
    bounds = np.asarray(bounds, dtype=np.int64)
    total = int(bounds[-1])
    parts = []
    pos = start
    while pos < stop:  # once per pass over the items: twice at most but for tiny epochs
        lap = pos - pos % total
        lo, hi = pos - lap, min(stop - lap, total)
        first = int(np.searchsorted(bounds, lo, side="right")) - 1
        last = int(np.searchsorted(bounds, hi, side="left"))  # items [first, last) hold rows
        items = np.arange(first, last, dtype=np.int64)
        begins = np.maximum(bounds[first:last], lo)
        ends = np.minimum(bounds[first + 1:last + 1], hi)
        keep = ends > begins
        items, begins, ends = items[keep], begins[keep], ends[keep]
        parts.append((begins + lap, items, begins - bounds[items], ends - begins))
        pos = lap + hi
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty
    return tuple(np.concatenate(x) for x in zip(*parts, strict=True))  # type: ignore[return-value]


@dataclass(frozen=True)
class _Deal:
    """Step 2 and 3 of the module docstring for one rank: who makes which batches of what."""

    num_batches: int
    # per worker: (batch positions, batch sizes, first and end virtual position of its span)
    workers: tuple[tuple[range, BatchSizes, int, int], ...]


def deal_rows(total: int, *, batch_size: int, rank: int, world_size: int, num_workers: int,
          drop_last: bool) -> _Deal:
    workers = max(1, num_workers)
    per_rank = epoch_rows(total, world_size=world_size, drop_last=drop_last)
    nb = per_rank // batch_size if drop_last else math.ceil(per_rank / batch_size)
    if total == 0 or nb == 0:
        return _Deal(0, tuple((range(0), BatchSizes(batch_size, 0, 0), 0, 0)
                              for _ in range(workers)))
    last = min(per_rank, nb * batch_size) - (nb - 1) * batch_size
    pos = rank * per_rank
    out = []
    for w in range(workers):
        positions = range(w, nb, workers)
        ends = bool(positions) and positions[-1] == nb - 1  # this worker makes the last batch
        sizes = BatchSizes(batch_size, len(positions), last if ends else batch_size)
        span = sizes.total()
        out.append((positions, sizes, pos, pos + span))
        pos += span
    return _Deal(nb, tuple(out))


def plan_epoch(
    fragment_rows: np.ndarray,
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    num_workers: int,
    seed: int,
    epoch: int,
    shuffle: bool,
    drop_last: bool,
    window_rows: int,
    first_window_slices: int | None = None,
) -> RankPlan:
    """Plan one rank's epoch (see the module docstring). ``num_workers=0`` plans one worker.

    ``first_window_slices``: the start-up ramp of step 4; default :data:`FIRST_WINDOW_SLICES`.
    """
    if first_window_slices is None:
        first_window_slices = FIRST_WINDOW_SLICES  # read now, so that tests can change it
    rows = np.asarray(fragment_rows, dtype=np.int64)
    deal = deal_rows(int(rows.sum()), batch_size=batch_size, rank=rank, world_size=world_size,
                 num_workers=num_workers, drop_last=drop_last)
    order = fragment_order(len(rows), seed=seed, epoch=epoch, shuffle=shuffle)
    bounds = np.concatenate([[0], np.cumsum(rows[order])])
    plans = []
    for w, (positions, sizes, begin, end) in enumerate(deal.workers):
        at, items, offsets, takes = walk(begin, end, bounds)
        pieces = Slices(order[items], offsets, offsets + takes)
        windows = _windows(pieces, at, seed, epoch, shuffle, window_rows, first_window_slices)
        plans.append(WorkerPlan(w, tuple(whole(x) for x in windows), sizes, positions))
    return RankPlan(deal.num_batches, tuple(plans))


def advance(segments: tuple[Segment, ...], rows: int) -> tuple[Segment, ...]:
    """The segments left once their first ``rows`` rows are delivered."""
    done = 0  # not list.pop(0): quadratic in an unshuffled plan's segments, one a row group
    while done < len(segments) and segments[done].num_rows <= rows:
        rows -= segments[done].num_rows
        done += 1
    out = list(segments[done:])
    if rows:
        first = out[0]
        out[0] = Segment(first.window, first.start + rows, first.stop)
    return tuple(out)


# An unshuffled window (read in joined reads of a few MiB: ``_reads.in_order_reads``) holds at
# most this many slices, as many as ``window_rows`` rows allow: one a row group, an epoch of 1M
# row groups was 1M windows to plan and hold.
IN_ORDER_SLICES = 4096


def _windows(
    pieces: Slices, at: np.ndarray, seed: int, epoch: int, shuffle: bool, window_rows: int,
    first_window_slices: int,
) -> list[Window]:
    """``pieces`` (a worker's span, at virtual positions ``at``) cut into windows: each closes
    on the slice that brings it to ``window_rows`` rows, or to its most slices (shuffled: the
    start-up ramp of step 4, doubling; unshuffled: :data:`IN_ORDER_SLICES`)."""
    windows: list[Window] = []
    ends = np.cumsum(pieces.rows())  # rows up to and with each piece
    i, n = 0, len(pieces)
    most = max(1, first_window_slices) if shuffle else IN_ORDER_SLICES
    while i < n:
        before = int(ends[i - 1]) if i else 0
        full = int(np.searchsorted(ends, before + window_rows, side="left")) + 1
        j = min(max(full, i + 1), i + most, n)
        windows.append(Window(pieces[i:j], (seed, epoch, int(at[i])) if shuffle else None))
        if shuffle:
            most *= 2
        i = j
    return windows
