"""Property tests of the pure plan: exactly once, even ranks, determinism, bounded windows."""

from __future__ import annotations

import bisect
import pickle
import tracemalloc
from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pqloader._plan import (
    IN_ORDER_SLICES,
    BatchSizes,
    RankPlan,
    Segment,
    Window,
    advance,
    plan_epoch,
    walk,
)
from pqloader._reads import IN_ORDER_BYTES, in_order_reads
from pqloader._remainder import shared_windows
from pqloader._slices import Slice, Slices


def rows_of(plan: RankPlan, offsets: np.ndarray) -> list[int]:
    """Global row numbers a rank delivers, in delivery order (batch 0, 1, ... round-robin)."""
    per_worker = []
    for w in plan.workers:
        rows = []
        for seg in w.segments:
            window = seg.window
            flat = np.concatenate([
                np.arange(offsets[s.fragment] + s.start, offsets[s.fragment] + s.stop)
                for s in window.slices
            ])
            rows.extend(flat[window.order()][seg.start:seg.stop].tolist())
        assert len(rows) == w.num_rows
        cuts = np.cumsum((0, *w.batch_sizes))
        spans = zip(w.positions, cuts, cuts[1:], strict=False)
        per_worker.append({p: rows[a:b] for p, a, b in spans})
    out = []
    for k in range(plan.num_batches):
        out.extend(per_worker[k % len(plan.workers)][k])
    return out


worlds = st.fixed_dictionaries({
    "fragment_rows": st.lists(st.integers(1, 60), min_size=1, max_size=12),
    "batch_size": st.integers(1, 40),
    "world_size": st.integers(1, 5),
    "num_workers": st.integers(0, 4),
    "seed": st.integers(0, 2**32),
    "epoch": st.integers(0, 3),
    "shuffle": st.booleans(),
    "drop_last": st.booleans(),
    "window_rows": st.integers(1, 200),
    "first_window_slices": st.integers(1, 8),
})


def plan_all(w: dict, **over: object) -> list[RankPlan]:
    args = {**w, **over}
    rows = np.asarray(args.pop("fragment_rows"))
    return [plan_epoch(rows, rank=r, **args) for r in range(args["world_size"])]


@settings(max_examples=400, deadline=None)
@given(worlds)
def test_exactly_once_and_even_ranks(w: dict) -> None:
    rows = np.asarray(w["fragment_rows"])
    total, size, bs = int(rows.sum()), w["world_size"], w["batch_size"]
    offsets = np.concatenate([[0], np.cumsum(rows)])
    plans = plan_all(w)
    counts = {p.num_batches for p in plans}
    assert len(counts) == 1, "every rank must yield the same number of batches"
    delivered = [rows_of(p, offsets) for p in plans]
    seen = Counter(r for d in delivered for r in d)
    assert set(seen) <= set(range(total))
    if w["drop_last"]:
        assert max(seen.values(), default=1) == 1
        # the dropped remainder: under one batch per rank, plus the world's uneven tail
        assert total - len(seen) < size * bs + size
        for p in plans:
            for wp in p.workers:
                assert all(s == bs for s in wp.batch_sizes)
    else:
        assert len(seen) == total, "every row at least once"
        assert sum(seen.values()) - total <= size - 1, "at most world_size - 1 repeats"
    # only the rank's last batch may be short
    for p in plans:
        sizes = {
            k: s for wp in p.workers for k, s in zip(wp.positions, wp.batch_sizes, strict=True)
        }
        assert sorted(sizes) == list(range(p.num_batches))
        assert all(sizes[k] == bs for k in range(p.num_batches - 1))


@settings(max_examples=150, deadline=None)
@given(worlds)
def test_deterministic_and_epochs_differ(w: dict) -> None:
    assert plan_all(w) == plan_all(w)
    rows = np.asarray(w["fragment_rows"])
    offsets = np.concatenate([[0], np.cumsum(rows)])
    if w["shuffle"]:
        a = [rows_of(p, offsets) for p in plan_all(w, epoch=0)]
        b = [rows_of(p, offsets) for p in plan_all(w, epoch=1)]
        c = [rows_of(p, offsets) for p in plan_all(w, epoch=0, seed=w["seed"] + 1)]
        if max(len(r) for r in a) >= 12:  # too few rows could repeat an order by chance
            assert a != b or a != c  # epochs (or seeds) change the order


@settings(max_examples=150, deadline=None)
@given(worlds)
def test_unshuffled_single_worker_is_dataset_order(w: dict) -> None:
    rows = np.asarray(w["fragment_rows"])
    offsets = np.concatenate([[0], np.cumsum(rows)])
    (plan,) = plan_all(w, shuffle=False, world_size=1, num_workers=1)
    got = rows_of(plan, offsets)
    assert got == list(range(len(got)))


@settings(max_examples=150, deadline=None)
@given(worlds)
def test_windows_are_bounded(w: dict) -> None:
    """A window holds at most window_rows plus one fragment: memory does not grow with data.
    (An unshuffled one is read in joined reads of a few MiB whatever its size.)"""
    biggest = max(w["fragment_rows"])
    for p in plan_all(w):
        for wp in p.workers:
            for window in (seg.window for seg in wp.segments):
                assert window.num_rows <= w["window_rows"] + biggest
                assert len(window.slices) <= IN_ORDER_SLICES or w["shuffle"]


@settings(max_examples=150, deadline=None)
@given(worlds)
def test_first_windows_ramp_up(w: dict) -> None:
    """A worker's window k holds at most first_window_slices * 2**k slices; a window ends
    early only there: every one but the last reaches window_rows or that many slices."""
    for p in plan_all(w, shuffle=True):
        for wp in p.workers:
            windows = [seg.window for seg in wp.segments]
            for k, window in enumerate(windows):
                cap = w["first_window_slices"] * 2**k
                assert len(window.slices) <= cap
                if k < len(windows) - 1:
                    assert window.num_rows >= w["window_rows"] or len(window.slices) == cap


def test_shuffle_mixes_fragments_within_a_batch() -> None:
    rows = np.full(16, 1000)
    (plan,) = plan_all({"fragment_rows": rows.tolist(), "batch_size": 256, "world_size": 1,
                        "num_workers": 2, "seed": 0, "epoch": 0, "shuffle": True,
                        "drop_last": False, "window_rows": 4000})
    offsets = np.concatenate([[0], np.cumsum(rows)])
    first = rows_of(plan, offsets)[:256]
    assert len({r // 1000 for r in first}) >= 3, "a batch draws on several row groups"


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 9), batches=st.integers(0, 12), last=st.integers(1, 9),
       start=st.integers(-14, 14) | st.none(), stop=st.integers(-14, 14) | st.none())
def test_batch_sizes_behave_as_the_tuple_they_stand_for(size: int, batches: int, last: int,
                                                        start: int | None,
                                                        stop: int | None) -> None:
    sizes = BatchSizes(size, batches, last)
    spelled = tuple([size] * (batches - 1) + [last]) if batches else ()
    assert tuple(sizes) == spelled and len(sizes) == len(spelled)
    assert sizes.total() == sum(spelled)
    part = sizes[start:stop]
    assert tuple(part) == spelled[start:stop] and part.total() == sum(spelled[start:stop])
    for i in range(-batches, batches):
        assert sizes[i] == spelled[i]


def test_a_plan_of_many_small_batches_holds_no_number_per_batch() -> None:
    """200M rows in batches of 32 planned a tuple of 6M sizes and one of positions per worker
    (289 MiB, counted by a memory budget: found in review)."""
    plan = plan_epoch(np.full(3052, 65_536), batch_size=32, rank=0, world_size=1,
                      num_workers=2, seed=0, epoch=0, shuffle=True, drop_last=False,
                      window_rows=1_000_000)
    assert plan.num_batches == 6_250_496
    assert len(pickle.dumps(plan)) < 2_000_000  # its windows and segments alone
    assert sum(w.num_rows for w in plan.workers) == 3052 * 65_536


def _walk_one_by_one(start: int, stop: int, bounds: list[int]) -> list[tuple[int, ...]]:
    """The pieces of :func:`walk`, found a piece at a time (as it was written first)."""
    total, out, pos = bounds[-1], [], start
    while pos < stop:
        local = pos % total
        i = bisect.bisect_right(bounds, local) - 1
        take = min(bounds[i + 1] - local, stop - pos)
        out.append((pos, i, local - bounds[i], take))
        pos += take
    return out


@settings(max_examples=400, deadline=None)
@given(rows=st.lists(st.integers(0, 9), min_size=1, max_size=12).filter(any),
       start=st.integers(0, 60), length=st.integers(0, 120))
def test_walk_finds_the_pieces_one_by_one_would(rows: list[int], start: int,
                                                length: int) -> None:
    bounds = np.concatenate([[0], np.cumsum(rows)])
    pieces = walk(start, start + length, bounds)
    assert list(zip(*(a.tolist() for a in pieces), strict=True)) == \
        _walk_one_by_one(start, start + length, bounds.tolist())


@settings(max_examples=300, deadline=None)
@given(spans=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 9), st.integers(0, 9)),
                      max_size=8),
       start=st.integers(-10, 10) | st.none(), stop=st.integers(-10, 10) | st.none(),
       step=st.sampled_from([None, 1, 2, -1]))
def test_slices_behave_as_the_tuple_they_stand_for(spans: list[tuple[int, int, int]],
                                                   start: int | None, stop: int | None,
                                                   step: int | None) -> None:
    spelled = tuple(Slice(f, a, a + n) for f, a, n in spans)
    held = Slices([s.fragment for s in spelled], [s.start for s in spelled],
                  [s.stop for s in spelled])
    assert tuple(held) == spelled and len(held) == len(spelled)
    assert held == Slices.of(spelled) and hash(held) == hash(Slices.of(spelled))
    assert tuple(held[start:stop:step]) == spelled[start:stop:step]
    for i in range(-len(spelled), len(spelled)):
        assert held[i] == spelled[i]
    window = Window(spelled, None)
    assert window == Window(held, None) and hash(window) == hash(Window(held, None))
    assert window.num_rows == sum(s.num_rows for s in spelled)
    assert window.starts().tolist() == np.cumsum([0, *(s.num_rows for s in spelled)]).tolist()
    assert pickle.loads(pickle.dumps(window)) == window


def test_a_plan_of_many_row_groups_holds_no_object_per_row_group() -> None:
    """An epoch of 1M row groups was an object per row group (Slice, and unshuffled a Window
    and a Segment too): 161 MiB of plan shuffled, 540 unshuffled, and 5-9 s to plan it, in
    every process that planned it. Its slices are arrays now: ~24 bytes a row group."""
    rows = np.full(200_000, 1000)
    for shuffle in (True, False):
        tracemalloc.start()
        try:
            plan = plan_epoch(rows, batch_size=256, rank=0, world_size=1, num_workers=2,
                              seed=0, epoch=0, shuffle=shuffle, drop_last=False,
                              window_rows=500_000)
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert held < 200_000 * 40, shuffle  # was ~170 bytes a row group shuffled
        assert sum(len(s.window.slices) for w in plan.workers for s in w.segments) == 200_000
        assert sum(w.num_rows for w in plan.workers) == 200_000_000


def _joined_one_by_one(segments: list[Segment], window_rows: int, held: np.ndarray
                       ) -> list[tuple[tuple[int, int, int], ...] | Segment]:
    """What :func:`in_order_reads` makes, found a slice at a time (as it was written first):
    each in-order read as its slices, a shuffled segment as it is."""
    out: list[tuple[tuple[int, int, int], ...] | Segment] = []
    group: list[tuple[int, int, int]] = []
    rows = size = 0
    for segment in segments:
        if segment.window.key is not None:
            if group:
                out.append(tuple(group))
            group, rows, size = [], 0, 0
            out.append(segment)
            continue
        at = 0
        for s in segment.window.slices:
            lo, hi = max(segment.start - at, 0), min(segment.stop - at, s.num_rows)
            at += s.num_rows
            if lo >= hi:
                continue
            group.append((s.fragment, s.start + lo, s.start + hi))
            rows, size = rows + hi - lo, size + int(held[s.fragment])
            if size >= IN_ORDER_BYTES or (window_rows > 0 and rows >= window_rows):
                out.append(tuple(group))
                group, rows, size = [], 0, 0
    if group:
        out.append(tuple(group))
    return out


@settings(max_examples=300, deadline=None)
@given(w=worlds, held=st.lists(st.integers(0, IN_ORDER_BYTES), min_size=12, max_size=12),
       skip=st.integers(0, 100))
def test_in_order_reads_join_the_slices_one_by_one_would(w: dict, held: list[int],
                                                         skip: int) -> None:
    for p in plan_all(w):
        for wp in p.workers:
            segments = list(advance(wp.segments, min(skip, wp.num_rows)))
            got = in_order_reads(segments, w["window_rows"], np.array(held))
            spelled = [tuple((s.fragment, s.start, s.stop) for s in r.window.slices)
                       if r.window.key is None else r for r in got]
            assert spelled == _joined_one_by_one(segments, w["window_rows"], np.array(held))
            assert all(r.window.key is not None or (r.start, r.stop) ==
                       (0, r.window.num_rows) for r in got)


def _shared_one_by_one(windows: list[Window]) -> set[Window]:
    """:func:`shared_windows` as a loop over each row group's slices (as it was written)."""
    owners: dict[int, list[tuple[int, int, int]]] = {}
    for k, window in enumerate(windows):
        for s in window.slices:
            owners.setdefault(s.fragment, []).append((s.start, s.stop, k))
    shared: set[int] = set()
    for spans in owners.values():
        reach, holder = -1, -1
        for start, stop, k in sorted(spans):
            if start < reach and k != holder:
                shared.update((k, holder))
            if stop > reach:
                reach, holder = stop, k
    return {windows[k] for k in shared}


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 30), st.integers(1, 30)),
                         min_size=1, max_size=6), max_size=6))
def test_shared_windows_are_those_one_by_one_finds(spans: list[list[tuple[int, int, int]]]
                                                   ) -> None:
    windows = [Window(tuple(Slice(f, a, a + n) for f, a, n in w), (k,))
               for k, w in enumerate(spans)]
    assert shared_windows(windows) == _shared_one_by_one(windows)
