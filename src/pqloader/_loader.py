"""DataLoader: delivers one rank's planned batches through worker threads or processes."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.utils.data

from ._agree import Agreement, built_at
from ._audit import AuditLog, plan_name
from ._autotune import ThreadTuner, TunerReport
from ._config import (
    LoaderConfig,
    WorkerConfig,
    WorkerType,
    refuse_torch_order,
    refuse_torch_placement,
    resolve_num_workers,
)
from ._deliver import Delivery, OncePerIndex
from ._device import Placement, resolve_device
from ._epochs import NextEpoch, Pass
from ._errors import (
    InvalidArgumentError,
    StateMismatchError,
    check_positive,
)
from ._plan import RankPlan
from ._processes import ProcessDelivery
from ._remainder import dealt_origin
from ._state import PER_RANK, Cursor, check_own, make_state, read_state
from ._torch import Planner
from ._world import check_world, resolve_world

if TYPE_CHECKING:
    from ._dataset import ParquetDataset

class DataLoader:
    """Batches of torch tensors from a :class:`ParquetDataset`: sharded, shuffled, exactly once.

    Every rank yields ``len(loader)`` batches; over all ranks and workers each row comes once per
    epoch (without ``drop_last`` and with ``world_size > 1``, at most ``world_size - 1`` rows
    repeat, as with torch's ``DistributedSampler``). The order is fixed by (dataset, seed, epoch,
    rank, world_size, batch_size, num_workers, shuffle_window_rows).

    Args:
        dataset: the :class:`ParquetDataset` to read.
        batch_size: rows per batch; only the rank's last batch may be shorter.
        shuffle: mix rows: row groups in a seeded random order, then rows permuted inside
            windows of ``shuffle_window_rows`` rows (default: about 64 MiB of decoded data).
        seed: with the epoch, fixes the order and the transforms' ``rng``. Every rank must
            pass the same seed. It is the loader's own: ``torch.manual_seed`` does not change
            it, so vary ``seed=`` for runs of other orders.
        num_workers: threads (default) or processes making batches; 0 makes them in the caller.
            ``"auto"``: the batches of ``num_workers=0`` (one stream, whatever the tuning;
            not with ``memory_budget_bytes``, which sizes windows for those read ahead),
            one window read ahead per core (at most 8), and, while batches flow, as many
            threads collating and transforming them as the measured rate favours, from none
            to one per core. The caller makes the batches no thread has taken (all of them at
            zero threads), so ``worker_init_fn`` and ``transform`` may run in the caller's
            thread. :attr:`autotune` tells what it measured.
        worker_type: ``"thread"`` (pyarrow decodes without the GIL; no copy between workers) or
            ``"process"`` (torch's worker processes, for transforms that hold the GIL).
        drop_last: drop the rank's last, short batch.
        transform: ``transform(batch)`` or ``transform(batch, rng)`` on each batch dict, in the
            workers; ``rng`` is a ``numpy.random.Generator`` seeded by (seed, epoch, rank,
            batch position), so random augmentation is reproducible. Thread workers call the
            same object at once from several threads: keep no batch on ``self`` between
            calls (or use ``worker_type="process"``, where each worker has its copy).
        collate_fn: replaces the conversion to tensors: receives the ``pyarrow.RecordBatch``
            (``batch.to_pylist()``: its rows as dicts, what torch's collate_fn gets); called
            from several threads at once too.
        rank, world_size: this process's place; default: from ``torch.distributed`` if
            initialised, else a single rank (iterating it once a group of several is up raises:
            build the loader after ``init_process_group``).
        pin_memory, timeout, worker_init_fn, persistent_workers, prefetch_factor,
        multiprocessing_context: as for ``torch.utils.data.DataLoader``; ``timeout`` (seconds,
            0 = wait forever) raises :class:`pqloader.LoaderTimeoutError`, counted from when
            the workers are up (started, ``worker_init_fn`` returned; that may take 60 s
            more), for batches workers make: not for those the caller makes with
            ``num_workers=0`` (reads only are timed there); ``"auto"`` keeps a thread.
            Pinned batches keep their tensors of one dtype and shape in one slab of
            page-locked memory; an object of another kind with a ``pin_memory()`` method
            (torch's custom batch) is pinned by it. Thread workers start anew at each pass
            and share the process: ``worker_init_fn(i)`` runs in the thread of index ``i``
            (with ``persistent_workers``, only in the first pass's), that thread makes
            batches of any worker, and ``torch.initial_seed()`` there is the process's. Keep
            what it sets up in a global or closure, not ``threading.local``.
        device: a CUDA device (``"cuda"``, ``"cuda:1"``): batches arrive there. Each batch
            is staged in pinned memory and crosses in one copy, on a side stream; the caller's
            current stream waits for it, so use the batch on that stream. ``"cuda"`` is the
            current device when the first batch is copied, as for ``tensor.to("cuda")``:
            under DDP, call ``torch.cuda.set_device(local_rank)`` before iterating. ``None`` or
            ``"cpu"``: batches stay on the host.
        memory_budget_bytes: the most resident memory (RSS) the loader may add to its
            processes, all workers together, above what they held when the iteration began.
            Shuffle windows are sized to fit (smaller windows mix less) the windows held at
            once, which grow with the workers (with ``"auto"``, one per core read ahead): the
            order then depends on ``num_workers`` and, for ``"auto"``, on the machine's
            cores. A worker reads a window ahead only while the real RSS leaves room for its
            row groups, and makes a batch ahead only while it leaves room for the largest
            batch so far, at most a window's rows of them (fewer than ``prefetch_factor``
            asks for, when it asks for more). Memory the training step allocates meanwhile
            counts too: leave it room. Too small a budget for one row group per window raises
            :class:`pqloader.InvalidArgumentError`; a ``RuntimeWarning`` says when what the
            loader needs to progress (a large ``batch_size`` of heavy rows, list columns
            padded to each batch's longest row) passes 1.1x the budget.
        audit_dir: record the rows of every batch yielded, in a file per process in this
            folder, for :func:`pqloader.audit` (``pqloader audit DIR``) to check that an epoch
            saw every row exactly once, across ranks, workers and restarts.
        sampler, batch_sampler, generator: torch's, refused by name: the loader orders the
            rows itself (``shuffle``, ``seed``, the ranks). ``in_order``: always (exact
            resume counts on it); ``False`` is refused. ``pin_memory_device``: refused, for
            ``device=``.
    """

    def __init__(
        self,
        dataset: ParquetDataset,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        num_workers: int | Literal["auto"] = 2,
        drop_last: bool = False,
        transform: Callable[..., Any] | None = None,
        collate_fn: Callable[..., Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        shuffle_window_rows: int | None = None,
        worker_type: WorkerType = "thread",
        pin_memory: bool = False,
        device: str | int | torch.device | None = None,
        timeout: float = 0.0,
        worker_init_fn: Callable[[int], Any] | None = None,
        persistent_workers: bool = False,
        prefetch_factor: int | None = 2,
        multiprocessing_context: Any = None,
        audit_dir: str | os.PathLike[str] | None = None,
        memory_budget_bytes: int | None = None,
        sampler: None = None,
        batch_sampler: None = None,
        generator: None = None,
        in_order: bool = True,
        pin_memory_device: str = "",
    ) -> None:
        from ._dataset import ParquetDataset

        if not isinstance(dataset, ParquetDataset):
            raise InvalidArgumentError(_not_a_dataset(dataset))
        refuse_torch_order(sampler=sampler, batch_sampler=batch_sampler, generator=generator)
        refuse_torch_placement(in_order=in_order, pin_memory_device=pin_memory_device)
        self.config = LoaderConfig(
            batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
            shuffle_window_rows=shuffle_window_rows, transform=transform,
            collate_fn=collate_fn, world=resolve_world(rank, world_size),
            memory_budget_bytes=memory_budget_bytes,
        )
        streams, autotune = resolve_num_workers(num_workers, worker_type)
        if memory_budget_bytes is not None and worker_type == "process":
            raise InvalidArgumentError(
                "memory_budget_bytes is held for thread workers (the default) and num_workers=0; "
                "worker processes each count pages they share with the parent and copy on "
                "write, which their own RSS does not show: use worker_type='thread' or size "
                "shuffle_window_rows yourself"
            )
        if prefetch_factor is None:  # torch's default spelling: its default
            prefetch_factor = 2
        self.workers = WorkerConfig(
            num_workers=streams, worker_type=worker_type, prefetch_factor=prefetch_factor,
            pin_memory=pin_memory, timeout=timeout, worker_init_fn=worker_init_fn,
            persistent_workers=persistent_workers,
            multiprocessing_context=multiprocessing_context,
        )
        self.dataset = dataset
        # torch's attributes, as given (validated), for logging and frameworks that read them
        self.num_workers, self.drop_last = num_workers, self.config.drop_last
        self.pin_memory, self.timeout = self.workers.pin_memory, self.workers.timeout
        self.prefetch_factor = self.workers.prefetch_factor
        self.persistent_workers = self.workers.persistent_workers
        self.collate_fn, self.worker_init_fn = collate_fn, worker_init_fn
        self.multiprocessing_context, self.in_order = multiprocessing_context, True
        # num_workers="auto": one stream (the order of num_workers=0), read ``streams``
        # windows ahead (one per core); the tuner picks how many threads, up to one per core,
        # collate and transform its batches beside the caller, from the measured rate.
        # With timeout=, every batch is made in a thread the caller can time out on: made by
        # the caller, a hung transform hung it, timeout or not (found in review).
        self._tuner = ThreadTuner(streams, settle_batches=prefetch_factor * streams,
                                  min_threads=1 if timeout else 0) if autotune else None
        self._plan_workers = 1 if autotune else streams  # workers the plan deals batches to
        self._planner = Planner(dataset, self.config, audit=audit_dir is not None,
                                streams=max(1, streams), timeout_s=timeout)
        self._audit_dir = audit_dir
        self._audit: AuditLog | None = None
        self._agreement = Agreement(self.config.world, built_at(1))
        self._epoch = 0
        self._batches = 0  # batches of self._epoch yielded so far (what state_dict saves)
        self._passes = 0  # iterations begun: only the latest one moves the cursor
        self._resume: int | None = None  # batches to skip in the next iteration (restored)
        self._resumed_pass: int | None = None  # the pass under way that a state resumed
        self._next = NextEpoch(world_size=self.config.world.world_size,
                               shuffle=self.config.shuffle)  # without set_epoch
        self.device = resolve_device(device)
        pin = pin_memory and torch.cuda.is_available()
        if pin_memory and not pin:
            warnings.warn("pin_memory=True but no CUDA device is available: not pinning",
                          stacklevel=2)
        self._placement = Placement(pin=pin, device=self.device, audited=audit_dir is not None)
        # torch's thread pins each tensor there; a device copy is made in receive
        self._processes = ProcessDelivery(self._planner, self.workers,
                                          pin=self._placement.pin)
        # Threads start anew every pass; persistent ones run worker_init_fn once per index
        self._thread_init = OncePerIndex(worker_init_fn) \
            if worker_init_fn is not None and persistent_workers else worker_init_fn

    # -- the torch habits -------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @property
    def autotune(self) -> TunerReport | None:
        """With ``num_workers="auto"``: the thread count in use and the batches/s measured at
        each count tried; else None."""
        return None if self._tuner is None else self._tuner.report

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration follows (call it on every rank).

        Setting the epoch a restored state is in keeps its cursor: the iteration resumes.
        Without it, in one process, a pass begun after a pass that took its epoch's last
        batch is the next epoch (as torch's ``DataLoader(shuffle=True)`` shuffles anew at
        each pass); one begun after a pass left early starts that epoch over. Over several
        ranks the epoch moves on only by this call (or a state at its epoch's end), as with
        ``DistributedSampler``: ranks that made other numbers of passes would plan other
        epochs.
        """
        check_positive("epoch", epoch, allow_zero=True)
        self._next.chosen()
        if epoch != self._epoch:
            self._epoch, self._batches, self._resume = epoch, 0, None
            self._forget_origin()

    def _forget_origin(self) -> None:
        """Plan whole epochs again, after the pass that a state with other settings resumed."""
        if self._planner.origin is not None:
            self._planner.origin = None
            self._processes.forget()  # persistent worker processes hold the old plan

    def __getitem__(self, index: Any) -> Any:
        """Refused, saying why: torch's ``DataLoader`` given this loader took it for a
        map-style dataset and failed with "'DataLoader' object is not subscriptable"."""
        raise TypeError(
            "pqloader.DataLoader yields batches itself: iterate it directly (for batch in "
            "loader); for torch's DataLoader, give it ds.to_torch(batch_size=...) with "
            "batch_size=None")

    def __len__(self) -> int:
        """Batches of this epoch on this rank (the same on every rank): a whole epoch's, also
        after a resume. For an epoch resumed under other settings (world size, batch size),
        the batches before the state plus those dealt after it, so it may differ from the
        epochs before and after; once that pass is over, the whole epoch a next pass makes
        (it said the resumed length until that pass began, found by fuzzing)."""
        if (self._resume is None and self._resumed_pass is None) or \
                self._next.advances(self._epoch):
            return len(self._planner)  # (the next pass plans a whole epoch)
        return self._planner.epoch_batches(self._epoch)

    # -- resume -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: a small JSON-serialisable dict (no pickle, no data).

        It holds the epoch, the batches every rank has yielded in it, the settings that fix the
        order and a fingerprint of the dataset. Save it with the model at a step; in DDP the
        ranks step in lockstep, so rank 0's state restores every rank whose settings are
        rank 0's (the same ``num_workers`` and window size): else restore each rank's own.
        It says which (``ranks_alike``; ``None`` while unknown: until every rank has
        compared with rank 0, and in other ranks' states): a state of unlike ranks restores
        only the rank that saved it, with its settings, and one that does not know resumes
        only under its own settings (``ranks_compared``: whether the ranks are compared at
        all; with no process group nothing can tell, and the state is trusted).
        """
        batches = self._batches if self._resume is None else self._resume
        origin = self._planner.origin
        chain = origin[1] if origin is not None and origin[0] == self._epoch else None
        cursor = Cursor(self._epoch, batches, self._planner.settings(self._plan_workers),
                        chain)
        # whether other ranks' plans are this one's (an elastic resume rebuilds them all
        # from this state's settings): None while unknown
        return {**make_state(cursor, self._planner.fingerprint),
                "rank": self.config.world.rank, "ranks_alike": self._agreement.alike(),
                "ranks_compared": self._agreement.compared}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved state.

        With the settings it was saved with, the next iteration yields exactly the batches that
        followed it in the uninterrupted run, random transforms included. With another
        ``num_workers``, ``world_size``, ``batch_size`` or ``shuffle_window_rows`` (elastic),
        the rows no rank had yet yielded are dealt out to the new ranks and workers: each comes
        exactly once in the rest of the epoch (plus at most ``world_size - 1`` repeats when
        padding, as always) and no yielded row comes again; the order of those rows is new,
        in windows of this loader's size (the old windows are cut to it: a memory budget
        holds); in the same world size and batch size each rank deals out its own rows left
        (beside ranks that resume exactly, the two agree). Either way at most one shuffle
        window per worker is read before the first batch. A loader whose window size is
        automatic (no ``shuffle_window_rows``) takes the state's, unless that would pass its
        ``memory_budget_bytes``: the automatic size may differ between pqloader versions.

        Raises:
            StateMismatchError: the state is from another dataset or other settings.
        """
        planner = self._planner
        current = planner.settings(self._plan_workers)
        cursor = read_state(state, planner.fingerprint, current)
        try:
            saved = planner.level(cursor.epoch, cursor.settings, cursor.origin)
        except (KeyError, TypeError, ValueError, IndexError, RecursionError) as exc:
            raise StateMismatchError(f"the state's plan cannot be rebuilt: {exc!r}") from exc
        if cursor.batches > saved[0].num_batches:
            raise StateMismatchError(
                f"state cursor batches={cursor.batches} is out of range: the saved plan has "
                f"{saved[0].num_batches} batches per rank in epoch {cursor.epoch}"
            )
        rows = cursor.settings.get("shuffle_window_rows", 0)
        check_own(state, cursor, {**current, "shuffle_window_rows": rows}
                  if planner.would_adopt(rows) else current, self.config.world.rank,
                  complete=cursor.batches == saved[0].num_batches)
        if planner.adopt_window_rows(rows):
            current = planner.settings(self._plan_workers)  # the state is valid: now adopt
        if dict(cursor.settings) == current:
            origin, batches = cursor.origin, cursor.batches
        elif cursor.batches == 0:  # nothing of that plan delivered: deal what it was dealt
            # (its drop_last dropped no row twice), the old windows cut to this loader's
            if cursor.origin is None:
                origin = None
            elif {"own", "shares"} & set(cursor.origin):
                origin = dealt_origin(cursor.origin, current)
            else:  # saved before either: dealt as then, as a rank of the state's settings
                origin = {**cursor.origin, "recut": True}  # deals it (found in review)
            batches = 0
        else:
            origin = dealt_origin({"settings": dict(cursor.settings),
                                   "batches": cursor.batches, "resumed_from": cursor.origin},
                                  current)
            batches = 0
        planner.origin = None if origin is None else (cursor.epoch, origin)
        self._processes.forget()  # persistent worker processes must see the new plan
        self._epoch, self._batches, self._resume = cursor.epoch, batches, batches
        # a state at its epoch's end: iterated as it is, the next epoch (set_epoch of the
        # state's epoch keeps the cursor: that pass yields nothing)
        self._next.loaded(cursor.epoch, at_end=cursor.batches == saved[0].num_batches)

    def __iter__(self) -> Iterator[Any]:
        """A pass over this rank's batches (lazy, as a generator: it begins at its first
        ``next``); one that an error ended says so if asked for more (:class:`Pass`)."""
        return Pass(self._pass(), lambda: self._batches)

    def _pass(self) -> Generator[Any, None, None]:
        check_world(self.config.world, "DataLoader")
        self._next_epoch()
        settings = self._planner.settings(self._plan_workers)
        self._agreement.begin(self._planner.agreed(), {k: settings[k] for k in PER_RANK})
        if self._resume is None:  # not the pass a restored state resumes: a whole epoch
            self._forget_origin()
        epoch, start = self._epoch, self._resume or 0
        self._resume, self._batches = None, start
        self._passes += 1
        this_pass = self._passes  # an older pass's iterator, resumed by hand, counts no more
        self._resumed_pass = this_pass if self._planner.origin is not None else None
        w = self.workers
        if (memory := self._planner.stages.memory) is not None:
            memory.start()  # thread workers only (checked in __init__): one process counts
        plan = self._planner.plan(epoch, max(1, self._plan_workers))
        last = plan.num_batches  # the pass's last batch ends the epoch, taken by zip or islice
        if self._tuner is not None:
            batches: Iterator[Any] = self._iter_auto(plan, epoch, start)
        elif w.num_workers == 0:
            place = self._placement
            batches = map(lambda b: place.receive(place.finish(b)),
                          self._planner.batches(plan, 0, epoch, start))
        elif w.worker_type == "thread":
            batches = self._iter_threads(plan, epoch, start)
        else:
            batches = self._processes.batches(epoch, start, self._placement.receive)
        if self._audit_dir is not None:
            c = self.config
            if self._audit is None:
                self._audit = AuditLog(self._audit_dir, rank=c.world.rank,
                                       world_size=c.world.world_size,
                                       num_workers=self._plan_workers,
                                       dataset=self._planner.fingerprint,
                                       batch_size=c.batch_size, drop_last=c.drop_last)
            origin = self._planner.origin
            named = plan_name(origin[1] if origin is not None and origin[0] == epoch else None,
                              c.world.world_size, c.batch_size, c.drop_last)
        try:
            for k, batch in enumerate(batches, start + 1):
                self._agreement.poll()
                if memory is not None:
                    memory.warn_if_over()
                if self._audit is not None:
                    batch, rows = batch
                    self._audit.record(epoch, k - 1, rows, named, made=batch)
                if self._passes == this_pass and self._epoch == epoch:
                    self._batches = k  # counted before the caller has it: a state now
                    if k == last:  # excludes it; the last one, taken, ends the epoch
                        self._next.ended(epoch)  # (and a resumed pass: len() is the next's,
                        if self._resumed_pass == this_pass:  # its iterator kept or not)
                            self._resumed_pass = None
                yield batch
            self._agreement.poll(now=True)
            if self._passes == this_pass and self._epoch == epoch:
                self._next.ended(epoch)  # (a pass of no batch: resumed at its end)
        finally:
            if self._resumed_pass == this_pass:
                self._resumed_pass = None

    def _next_epoch(self) -> None:
        """At a pass's start: the next epoch, where ``_epochs.py`` says so."""
        if self._next.begin(self._epoch, self._batches, resuming=self._resume is not None):
            self._epoch, self._batches, self._resume = self._epoch + 1, 0, None
            self._forget_origin()

    # -- delivery ---------------------------------------------------------------------------
    def _iter_threads(self, plan: RankPlan, epoch: int, start: int) -> Iterator[Any]:
        """Fixed ``num_workers``: thread ``w`` makes worker ``w``'s batches, as torch's."""
        n = self.workers.num_workers
        streams = [self._planner.batches(plan, w, epoch, start) for w in range(n)]
        yield from self._deliver(streams, plan.num_batches, epoch, start, threads=n)

    def _iter_auto(self, plan: RankPlan, epoch: int, start: int) -> Iterator[Any]:
        """``num_workers="auto"``: one stream's batches, by the tuned number of threads."""
        n = self.workers.num_workers
        shared = self._planner.shared(plan, epoch, start, ahead=n)
        try:
            yield from self._deliver(shared.streams(n, plan.num_batches), plan.num_batches,
                                     epoch, start, threads=None)
        finally:
            shared.close()

    def _depth(self, n: int) -> int:
        """Batches made ahead: ``prefetch_factor`` per worker, and under a memory budget no
        more than a shuffle window's rows per worker (the budget keeps room for one). Each
        holds memory of its own: 64 per worker of 4,096 rows took an 80 MiB budget to 143."""
        depth = self.workers.prefetch_factor * n
        if self.config.memory_budget_bytes is not None:
            depth = min(depth, max(n, n * self._planner.window_rows // self.batch_size))
        return depth

    def _deliver(self, streams: list[Iterator[Any]], stop: int, epoch: int, start: int,
                 threads: int | None) -> Iterator[Any]:
        """Batches ``start .. stop - 1`` of ``streams`` (``threads=None``: the tuner's)."""
        n = len(streams)
        tuner = self._tuner if threads is None else None
        delivery = Delivery(
            streams, start=start, stop=stop, depth=self._depth(n),
            threads=tuner.threads if tuner is not None else threads or 0, max_threads=n,
            finish=self._placement.finish,
            caller_helps=tuner is not None and not self.workers.timeout,
            worker_init_fn=self._thread_init, timeout_s=self.workers.timeout,
            where=f"rank {self.config.world.rank}, epoch {epoch}",
            memory=self._planner.stages.memory,
        )
        if tuner is not None:
            tuner.restart_interval()
        try:
            for k in range(start, stop):
                batch = self._placement.receive(delivery.get(k))
                if tuner is not None and (new := tuner.observe()) is not None:
                    delivery.set_threads(new)
                yield batch
            delivery.check()
        finally:
            delivery.close()


def _not_a_dataset(dataset: Any) -> str:
    """What to do with a ``dataset=`` that is not a ParquetDataset."""
    told = f"dataset must be a pqloader.ParquetDataset, got {type(dataset).__name__}"
    if isinstance(dataset, (str, os.PathLike)):
        return (f"{told}: open it first, pqloader.DataLoader(pqloader.ParquetDataset("
                f"{os.fspath(dataset)!r}), batch_size=...)")
    if hasattr(dataset, "__getitem__") or hasattr(dataset, "__iter__"):
        return f"{told}: for another dataset, use torch.utils.data.DataLoader"
    return told
