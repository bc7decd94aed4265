"""One worker's stages: read a window -> permute -> cut batches -> to tensors -> transform.

Each stage is a plain generator; :func:`worker_batches` composes them for one ``WorkerPlan``.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ._collate import Kind, Ragged, prepare, to_arrow, to_torch, window_order
from ._errors import InvalidArgumentError, LoaderTimeoutError, PQLoaderError
from ._memory import MemoryBudget
from ._plan import Segment, Window, WorkerPlan, advance
from ._read import PARALLEL_FRAGMENTS, FragmentReader
from ._reads import IN_ORDER_BYTES, bounded, in_order_reads
from ._slices import Slice
from ._threads import EXITING, DaemonPool
from ._transform import transform_arity, transform_rng, transform_rng_keyword
from ._where import describe, rows_from

Columns = dict[str, Any]  # name -> numpy array (numbers) or Arrow array
ROWS = "__pqloader_rows__"  # the hidden column of global row numbers, when auditing
WHERE = "__pqloader_where__"  # where a batch's rows come from, for error notes: (window,
# start, stop) parts, positions in the window's emission order


@dataclass
class _Loaded:
    columns: Columns  # the window's columns, already in emission order
    num_rows: int
    segment: Segment


@dataclass(frozen=True)
class Stages:
    """Everything a worker needs besides its plan; picklable for worker processes."""

    reader: FragmentReader
    kinds: Mapping[str, Kind]
    seed: int
    transform: Callable[..., Any] | None = None
    collate_fn: Callable[[pa.RecordBatch], Any] | None = None
    audit: bool = False  # carry each batch's global row numbers beside it
    memory: MemoryBudget | None = None  # memory_budget_bytes, held while reading ahead
    timeout_s: float = 0.0  # the loader's timeout: the longest wait for a window read (0: none)
    window_rows: int = 0  # the plan's window size: larger (older) windows are read in parts

    @functools.cached_property
    def arity(self) -> int:
        """The transform's: 2 when it takes the batch's generator (see transform_arity)."""
        return transform_arity(self.transform)

    @functools.cached_property
    def rng_keyword(self) -> str | None:
        """The keyword the generator goes to, where it goes by keyword."""
        return transform_rng_keyword(self.transform)

    def need_bytes(self, segment: Segment) -> int:
        """What reading ``segment`` adds to memory at its peak: its row groups decoded whole
        (a read holds each, also the rows a slice or a filter then leaves), and the permuted
        copy of the segment's rows. Counted from each row group's own bytes: a window of a
        dataset's heaviest rows (texts in some files, labels in others) needs many times what
        the mean row says, and read ahead by that estimate it passed the budget."""
        d = self.reader.discovery
        fragments, rows = segment.window.arrays.fragments, segment.window.arrays.rows()
        held = int(d.held()[fragments].sum())
        kept = float((d.byte_size[fragments] * rows / np.maximum(d.num_rows[fragments], 1)).sum())
        return held + int(kept * segment.num_rows / max(1, segment.window.num_rows))

    def load(self, segment: Segment) -> _Loaded:
        """Read a segment's window, permute it, keep the segment's rows."""
        window = segment.window
        if (segment.start, segment.stop) != (0, window.num_rows):
            return self._load_part(segment)
        tables = [t.slice(s.start, s.num_rows) for s, t in zip(
            window.slices, self.reader.read_many([s.fragment for s in window.slices]),
            strict=True)]
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        arrow = {name: table.column(name) for name in table.column_names}
        del table, tables  # from here each Arrow column is freed once its copy is made
        permutation = None if window.key is None else window.order()
        columns = self._prepare(arrow, permutation, window, locate=True)
        if self.audit:
            columns[ROWS] = self._row_numbers(window, permutation)
        return _Loaded(columns, segment.num_rows, segment)

    def _load_part(self, segment: Segment) -> _Loaded:
        """Part of a window (where a resumed worker stands in it; an old plan's window dealt
        to several new workers, or larger than this plan's): its slices read a few at a time
        (a window's rows of this plan at most, fetched together when remote), each cut to the
        part's rows at once, so memory holds the part and a window of this plan's size."""
        window = segment.window
        emitted = window.order()
        positions = emitted[segment.start:segment.stop]  # window rows, in emission order
        wanted = np.sort(positions)
        starts = window.starts().tolist()
        bounds = np.searchsorted(wanted, starts).tolist()
        needed = [(s, wanted[lo:hi] - first) for s, first, lo, hi in zip(
            window.slices, starts, bounds, bounds[1:], strict=False) if lo < hi]
        pieces: list[pa.Table] = []
        group: list[tuple[Slice, np.ndarray]] = []
        for k, item in enumerate(needed):
            group.append(item)
            rows = sum(s.num_rows for s, _ in group)
            if k == len(needed) - 1 or rows + needed[k + 1][0].num_rows > self.window_rows:
                tables = self.reader.read_many([s.fragment for s, _ in group])
                pieces += [t.slice(s.start, s.num_rows).take(pa.array(keep))
                           for (s, keep), t in zip(group, tables, strict=True)]
                group, tables = [], []
        table = pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)
        arrow = {name: table.column(name) for name in table.column_names}
        del table, pieces
        in_order = bool((positions[1:] > positions[:-1]).all())
        order = None if in_order else np.searchsorted(wanted, positions)
        columns = self._prepare(arrow, order, window, locate=False)
        if self.audit:
            columns[ROWS] = self._row_numbers(window, emitted)[segment.start:segment.stop]
        return _Loaded(columns, segment.num_rows, segment)

    def _prepare(self, arrow: dict[str, pa.ChunkedArray], permutation: np.ndarray | None,
                 window: Window, locate: bool) -> Columns:
        """The columns of ``arrow`` (emptied: each freed once its copy is made) in
        ``permutation``'s order (None: as they are), each ready to be cut in batches; a bad
        column's error names the window's row groups (``locate``: the columns hold the
        window's rows in read order, so those holding its nulls)."""
        keep_arrow = self.collate_fn is not None
        order = None if permutation is None else window_order(permutation)
        columns = {}
        column = None
        try:
            for name in list(arrow):
                kind = None if keep_arrow else self.kinds[name]
                column = arrow.pop(name)
                columns[name] = prepare(column, name, kind, order)
        except PQLoaderError as exc:
            exc.add_note("in " + describe(self.reader.discovery, window,
                                          column if locate else None))
            raise
        return columns

    @functools.cached_property
    def first_rows(self) -> np.ndarray:
        """Each fragment's first global row number (made once: a sum over every row group
        made per window cost an unshuffled epoch of 200,000 row groups 19 s)."""
        return np.concatenate([[0], np.cumsum(self.reader.discovery.num_rows)])

    def _row_numbers(self, window: Window, permutation: np.ndarray | None) -> np.ndarray:
        """Global row numbers (files and row groups in index order) of a window, as emitted."""
        first = self.first_rows
        rows = np.concatenate([np.arange(first[s.fragment] + s.start, first[s.fragment] + s.stop)
                               for s in window.slices])
        return rows if permutation is None else rows[permutation]


def _slice(values: Any, start: int, stop: int) -> Any:
    if isinstance(values, np.ndarray):
        return values[start:stop]
    return values.slice(start, stop - start)  # Arrow arrays and Ragged alike


def _concat(parts: list[Any]) -> Any:
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    if isinstance(parts[0], Ragged):
        return Ragged.concat(parts)
    return pa.concat_arrays(parts)


def _cut(loaded: Iterator[_Loaded], sizes: Sequence[int]) -> Iterator[Columns]:
    """Cut the stream of permuted segments into batches of the planned sizes, each with a
    hidden ``WHERE`` entry (its rows' windows and positions, for error notes: :func:`finish`
    pops it)."""
    pending: list[Columns] = []
    have = 0
    window: _Loaded | None = None
    pos = 0
    for size in sizes:
        where: list[tuple[Window, int, int]] = []
        while have < size:
            if window is None or pos == window.num_rows:
                window = None  # unbound while the next one loads: one window less held
                window, pos = next(loaded), 0
            take = min(size - have, window.num_rows - pos)
            end = pos + take  # numpy columns sliced inline: a call per column and batch cost
            # ~0.15 us, 5 us of a batch of W1's 33 columns (~45 us at 64 rows, measured)
            pending.append({n: v[pos:end] if type(v) is np.ndarray else _slice(v, pos, end)
                            for n, v in window.columns.items()})
            at = window.segment.start + pos
            where.append((window.segment.window, at, at + take))
            have += take
            pos += take
        batch = pending[0] if len(pending) == 1 else \
            {n: _concat([p[n] for p in pending]) for n in pending[0]}
        batch[WHERE] = tuple(where)
        yield batch
        pending, have = [], 0


def read_ahead(load: Callable[[Segment], _Loaded], windows: Sequence[Segment],
               memory: MemoryBudget | None = None,
               need_bytes: Callable[[Segment], int] = lambda segment: 0,
               ahead: int = 1, timeout_s: float = 0.0,
               describe: Callable[[Segment], str] | None = None) -> Iterator[_Loaded]:
    """Load segments in order, the next ``ahead`` on helper threads while one is consumed.

    Without it a worker stalls for a whole window load every window, and the round-robin
    delivery waits on it while the other workers sit on full queues. Costs ``ahead`` windows
    of memory per worker. With a ``memory`` budget, a read ahead starts only once
    ``need_bytes(segment)`` fit in it, or once its window is needed, whichever comes first.
    A load not done ``timeout_s`` after it is needed raises :class:`LoaderTimeoutError`: with
    ``num_workers`` 0 or ``"auto"`` the caller itself waits here, where no other timeout runs.
    """
    if not windows:
        return
    ahead = max(1, ahead)
    pool = DaemonPool(ahead, "pqloader-read")
    pending: deque[tuple[Future[_Loaded], threading.Event, Segment]] = deque()

    def early(segment: Segment, needed: threading.Event) -> _Loaded:
        need = 0 if memory is None else need_bytes(segment)
        if memory is not None:
            memory.wait_for_room(need, needed, EXITING)
        try:
            if EXITING.is_set():  # an abandoned iterator's read ahead: nobody will take it
                raise RuntimeError("the interpreter is exiting")
            return load(segment)
        finally:
            if memory is not None:
                memory.release(need)

    def submit(segment: Segment) -> None:
        needed = threading.Event()  # set once the consumer waits for this load
        if segment is windows[0]:
            needed.set()  # the first window: the least that makes progress, read at once
        pending.append((pool.submit(early, segment, needed), needed, segment))

    todo = iter(windows)
    try:
        for segment in itertools.islice(todo, ahead):
            submit(segment)
        while pending:
            future, needed, segment = pending.popleft()
            needed.set()
            try:
                current = future.result(timeout_s or None)
            except FutureTimeout:
                raise LoaderTimeoutError(
                    f"a shuffle window was not read within timeout={timeout_s} s; raise "
                    "timeout= or look for a slow or hung file system"
                    + (f" (reading {describe(segment)})" if describe else "")) from None
            if (following := next(todo, None)) is not None:
                submit(following)
            yield current
            del current
    finally:
        for future, needed, _ in pending:
            future.cancel()  # not started yet: never starts
            needed.set()  # a read ahead waiting for room stops waiting
        pool.shutdown()  # daemon threads (see _threads.py): a hung read cannot hold the exit


def raw_batches(stages: Stages, plan: WorkerPlan, *, skip: int = 0,
                ahead: int = 1) -> Iterator[tuple[int, Columns]]:
    """A worker's batches as (position, columns) cut from its permuted windows, not yet
    collated: :func:`finish` makes each one what the user sees, in any thread.

    ``skip``: batches of this worker already delivered (a resumed epoch). Segments wholly
    before them are not read; at most the one window the cursor falls in is read partly.
    ``ahead``: windows read ahead at once.
    """
    segments = bounded(advance(plan.segments, plan.batch_sizes[:skip].total()),
                        stages.window_rows)
    if segments and segments[0].window.key is None:  # unshuffled
        held = stages.reader.discovery.held()
        segments = in_order_reads(segments, stages.window_rows, held)
        if stages.reader.discovery.store is not None:
            # Remote, one read ahead left a round trip per read unhidden (5x slower than
            # shuffled windows, whose row groups are fetched together, over 20 ms of latency:
            # found in review): 8 go ahead (one per joined read of 4 row groups made epochs
            # 1.7x slower). Each read is at most IN_ORDER_BYTES or a row group: under a budget,
            # as many as a quarter of it holds (each read only once it fits: read_ahead): with
            # 8 under a 100 MiB budget, the reads' threads kept freed memory too (107-113 MiB;
            # 92-93 with 4), and with 4 under any budget, one that never bound made epochs
            # 1.5x slower (both found in review).
            most = PARALLEL_FRAGMENTS
            if stages.memory is not None:
                per_read = IN_ORDER_BYTES + int(held.max(initial=1))
                most = min(most, max(1, stages.memory.budget_bytes // (4 * per_read)))
            ahead = max(ahead, most)
    batches = _cut(read_ahead(stages.load, segments, stages.memory, stages.need_bytes,
                              ahead, stages.timeout_s,
                              lambda seg: describe(stages.reader.discovery, seg.window)),
                   plan.batch_sizes[skip:])
    yield from zip(plan.positions[skip:], batches, strict=True)


def finish(stages: Stages, position: int, columns: Columns, *, epoch: int, rank: int,
           first_position: int = 0) -> Any:
    """One cut batch as the user will see it: collated, then transformed.

    ``first_position`` offsets the batch positions that key random transforms.
    """
    rows = columns.pop(ROWS, None)
    where: tuple[tuple[Window, int, int], ...] = columns.pop(WHERE, ())
    number = first_position + position  # in the epoch (position: since an elastic resume)
    if stages.collate_fn is not None:
        try:
            batch = stages.collate_fn(to_arrow(columns))
        except Exception as exc:
            exc.add_note(f"in pqloader collate_fn, batch {number} of rank {rank}, epoch "
                         f"{epoch}{rows_from(stages.reader.discovery, where)}; it is given the "
                         "batch as a pyarrow.RecordBatch (iterating one gives its columns; "
                         "batch.to_pylist() its rows as dicts, as torch's collate_fn gets)")
            raise
    else:
        try:
            batch = to_torch(columns, stages.kinds)
        except PQLoaderError as exc:  # text not UTF-8: the row group of its row named
            if (row := getattr(exc, "row", None)) is not None:
                exc.add_note(f"in batch {number} of rank {rank}, epoch {epoch}, row {row}"
                             f"{rows_from(stages.reader.discovery, where, row=row)}")
            else:
                exc.add_note(f"in batch {number} of rank {rank}, epoch {epoch}"
                             f"{rows_from(stages.reader.discovery, where)}")
            raise
    if stages.transform is not None:
        try:
            keyword = stages.rng_keyword  # None where the generator goes second, or not
            if stages.arity == 2 or keyword is not None:
                rng = transform_rng(stages.seed, epoch, rank, number)
                made = stages.transform(batch, rng) if keyword is None else \
                    stages.transform(batch, **{keyword: rng})
            else:
                made = stages.transform(batch)
        except Exception as exc:
            exc.add_note(f"in pqloader transform, batch {number} of rank {rank}, "
                         f"epoch {epoch}{rows_from(stages.reader.discovery, where)}")
            raise
        if stages.memory is not None:  # the batch and what the transform made of it, both
            stages.memory.watch()  # held: looked at only after, the peak went unwarned
        batch = made  # (a 16,384-row padded batch cloned: 1.37x the budget, found by fuzzing)
        if batch is None:  # a transform that changed its batch in place and returned nothing
            raise InvalidArgumentError(
                f"transform {getattr(stages.transform, '__name__', stages.transform)!r} "
                f"returned None for batch {number} of rank {rank}, epoch {epoch}: it must "
                "return the batch (did it change it in place and forget `return batch`?)")
    if stages.memory is not None:
        stages.memory.watch()  # warns once the budget is passed: batches may do that alone
    return batch if rows is None else (batch, rows)


def worker_batches(
    stages: Stages, plan: WorkerPlan, *, epoch: int, rank: int, skip: int = 0,
    first_position: int = 0,
) -> Iterator[Any]:
    """The batches of one worker, in order, as the user will see them (see
    :func:`raw_batches` for ``skip``, :func:`finish` for ``first_position``)."""
    for position, columns in raw_batches(stages, plan, skip=skip):
        yield finish(stages, position, columns, epoch=epoch, rank=rank,
                     first_position=first_position)
