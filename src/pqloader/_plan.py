"""The epoch plan: a pure function from fragments and world to each worker's windows.

No IO and no torch: values in, values out, so property tests can check the invariants across
thousands of worlds.

The plan of one epoch, for one rank:

1. Fragments (row groups) are put in an order: a permutation seeded by ``(seed, epoch)`` when
   shuffling, else index order. Their rows, in that order, form the epoch's *virtual sequence*.
2. Rank ``r`` takes positions ``[r * per_rank, (r + 1) * per_rank)`` of the sequence. Without
   ``drop_last``, ``per_rank = ceil(rows / world_size)`` and positions past the end wrap to the
   start (at most ``world_size - 1`` rows repeat, as torch's ``DistributedSampler`` pads); with
   it, ``per_rank = rows // world_size``. Every rank has the same number of batches.
3. The rank's batches ``0 .. num_batches - 1`` are dealt to workers round-robin: worker ``w``
   makes batches ``w, w + W, w + 2W, ...``, which is the order torch's DataLoader collects them.
   Each worker reads a contiguous span of the rank's positions, so no row group is decoded twice
   except where a span boundary cuts it.
4. A worker's span is cut into *windows* of whole slices of row groups, at least
   ``window_rows`` rows each. A shuffled window is emitted in a permutation seeded by
   ``(seed, epoch, start)``, ``start`` being the window's first virtual position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Slice:
    """Rows ``[start, stop)`` of fragment ``fragment``."""

    fragment: int
    start: int
    stop: int

    @property
    def num_rows(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Window:
    """Slices read together and emitted in one permutation (``key is None``: in order)."""

    slices: tuple[Slice, ...]
    key: tuple[int, ...] | None

    @property
    def num_rows(self) -> int:
        return sum(s.num_rows for s in self.slices)

    def order(self) -> np.ndarray:
        """The order in which this window's rows (numbered as its slices concatenated) go out."""
        if self.key is None:
            return np.arange(self.num_rows, dtype=np.int64)
        return np.random.default_rng(list(self.key)).permutation(self.num_rows)


@dataclass(frozen=True)
class WorkerPlan:
    """What one worker of one rank does in one epoch."""

    worker: int
    windows: tuple[Window, ...]
    batch_sizes: tuple[int, ...]  # one per batch this worker makes, in order
    positions: tuple[int, ...]  # each batch's index in the rank's epoch

    @property
    def num_rows(self) -> int:
        return sum(self.batch_sizes)


@dataclass(frozen=True)
class RankPlan:
    """One rank's epoch: its batch count and its workers' plans."""

    num_batches: int
    workers: tuple[WorkerPlan, ...]


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
    return np.random.default_rng([seed, epoch]).permutation(num_fragments)


def _span_slices(
    start: int, stop: int, order: np.ndarray, bounds: np.ndarray, rows: np.ndarray
) -> list[tuple[int, Slice]]:
    """Slices covering virtual positions ``[start, stop)``, each with its first position.

    ``bounds[i]`` is the first position of ``order[i]``; positions past the total wrap around.
    """
    total = int(bounds[-1])
    out: list[tuple[int, Slice]] = []
    pos = start
    while pos < stop:
        local = pos % total
        i = int(np.searchsorted(bounds, local, side="right")) - 1
        frag = int(order[i])
        begin = local - int(bounds[i])
        take = min(int(rows[frag]) - begin, stop - pos)
        out.append((pos, Slice(frag, begin, begin + take)))
        pos += take
    return out


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
) -> RankPlan:
    """Plan one rank's epoch (see the module docstring). ``num_workers=0`` plans one worker."""
    rows = np.asarray(fragment_rows, dtype=np.int64)
    total = int(rows.sum())
    workers = max(1, num_workers)
    nb = num_batches(rows, batch_size=batch_size, world_size=world_size, drop_last=drop_last)
    if total == 0 or nb == 0:
        empty = tuple(WorkerPlan(w, (), (), ()) for w in range(workers))
        return RankPlan(0, empty)
    per_rank = epoch_rows(total, world_size=world_size, drop_last=drop_last)
    used = min(per_rank, nb * batch_size)
    last = used - (nb - 1) * batch_size

    order = fragment_order(len(rows), seed=seed, epoch=epoch, shuffle=shuffle)
    bounds = np.concatenate([[0], np.cumsum(rows[order])])
    pos = rank * per_rank
    plans = []
    for w in range(workers):
        positions = tuple(range(w, nb, workers))
        sizes = tuple(last if k == nb - 1 else batch_size for k in positions)
        span = sum(sizes)
        pieces = _span_slices(pos, pos + span, order, bounds, rows)
        pos += span
        plans.append(WorkerPlan(w, _windows(pieces, seed, epoch, shuffle, window_rows), sizes,
                                positions))
    return RankPlan(nb, tuple(plans))


def _windows(
    pieces: list[tuple[int, Slice]], seed: int, epoch: int, shuffle: bool, window_rows: int
) -> tuple[Window, ...]:
    if not shuffle:
        return tuple(Window((s,), None) for _, s in pieces)
    windows: list[Window] = []
    group: list[Slice] = []
    group_start = 0
    group_rows = 0
    for start, piece in pieces:
        if not group:
            group_start = start
        group.append(piece)
        group_rows += piece.num_rows
        if group_rows >= window_rows:
            windows.append(Window(tuple(group), (seed, epoch, group_start)))
            group, group_rows = [], 0
    if group:
        windows.append(Window(tuple(group), (seed, epoch, group_start)))
    return tuple(windows)
