"""A torch ``IterableDataset`` over the plan, safe under torch's own worker processes."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
from collections.abc import Generator, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch.utils.data

from ._agree import FIRST_WAIT_S, Agreement, built_at
from ._collate import column_kinds
from ._config import LoaderConfig
from ._epochs import Pass
from ._errors import InvalidArgumentError, StateMismatchError, check_positive
from ._fit import check_nulls, check_room, warn_unmixed
from ._memory import MemoryBudget
from ._pack import compact
from ._pipeline import Stages, finish, raw_batches, worker_batches
from ._plan import RankPlan, num_batches, plan_epoch
from ._remainder import own_remaining, plan_remainder, rank_share, recut, remaining
from ._shared import SharedStream
from ._state import fingerprint
from ._world import check_world, resolve_world

if TYPE_CHECKING:
    from ._dataset import ParquetDataset


class SharedCursor:
    """Where the next iteration starts: (epoch, batches already yielded in it, the workers
    of the plan they count in; 0: the next iteration's).

    Shared memory, so ``set_epoch`` and a restored state reach persistent worker processes.
    """

    def __init__(self) -> None:
        self._values = multiprocessing.RawArray("q", 3)

    def __reduce__(self) -> tuple[Any, ...]:
        # sent to a spawned worker: the same memory; else (pickle, deepcopy) a cursor of its
        # own at the same place (a RawArray pickles only while a process spawns: review)
        if multiprocessing.context.get_spawning_popen() is not None:
            return _shared_cursor, (self._values,)
        return _cursor_at, self.get()

    def get(self) -> tuple[int, int, int]:
        return int(self._values[0]), int(self._values[1]), int(self._values[2])

    def set(self, epoch: int, start: int = 0, workers: int = 0) -> None:
        self._values[0], self._values[1], self._values[2] = epoch, start, workers


def _shared_cursor(values: Any) -> SharedCursor:
    cursor = SharedCursor.__new__(SharedCursor)
    cursor._values = values
    return cursor


def _cursor_at(epoch: int, start: int, workers: int) -> SharedCursor:
    cursor = SharedCursor()
    cursor.set(epoch, start, workers)
    return cursor


def skipped(worker: int, start: int, num_workers: int) -> int:
    """Batches of ``worker`` among the rank's first ``start`` (dealt round-robin)."""
    return len(range(worker, start, num_workers))


class Planner:
    """Binds a dataset to a config: plans epochs and builds each worker's stages."""

    def __init__(self, dataset: ParquetDataset, config: LoaderConfig, *,
                 audit: bool = False, streams: int = 1, timeout_s: float = 0.0) -> None:
        self.dataset = dataset
        self.config = config
        d = dataset._discovery
        kinds = {} if config.collate_fn is not None else column_kinds(d.schema)
        if config.collate_fn is None:
            check_nulls(dataset)
        self.window_rows = config.window_rows(d.num_rows, d.byte_size, streams)
        memory = None
        if config.memory_budget_bytes is not None:  # refused first: no warning of a window
            memory = MemoryBudget(config.memory_budget_bytes)  # never used (found in review)
            check_room(dataset, config, streams)
        if config.shuffle and config.shuffle_window_rows is None:
            warn_unmixed(dataset, config, self.window_rows)
        self.stages = Stages(dataset.reader, kinds, config.seed, config.transform,
                             config.collate_fn, audit, memory, timeout_s, self.window_rows)
        self.fingerprint = fingerprint(d)
        # (epoch, chain): that epoch's plan is what the chain's plan left (see _state.Cursor)
        self.origin: tuple[int, Mapping[str, Any]] | None = None
        self._levels: dict[str, list[RankPlan]] = {}  # level()'s plans, each made once
        self._remainders: dict[str, RankPlan] = {}  # plan()'s of a resumed epoch, a few

    def __getstate__(self) -> dict[str, Any]:  # plans are remade where needed, not shipped
        return {**self.__dict__, "_levels": {}, "_remainders": {}}

    def adopt_window_rows(self, rows: int) -> bool:
        """Take a saved state's window size when this one was chosen automatically (and
        ``rows`` fits the memory budget, if any), so that the state resumes exactly: the
        automatic size changes with pqloader's estimate of decoded bytes. Whether it did."""
        if not self.would_adopt(rows):
            return False
        self.window_rows = rows
        self.stages = dataclasses.replace(self.stages, window_rows=rows)
        return True

    def would_adopt(self, rows: int) -> bool:
        """Whether :meth:`adopt_window_rows` would take ``rows``."""
        c = self.config
        return not (c.shuffle_window_rows is not None or rows == self.window_rows or rows < 1
                    or (c.memory_budget_bytes is not None and rows > self.window_rows))

    def __len__(self) -> int:
        c = self.config
        return num_batches(self.dataset._discovery.num_rows, batch_size=c.batch_size,
                           world_size=c.world.world_size, drop_last=c.drop_last)

    def epoch_batches(self, epoch: int) -> int:
        """Batches of ``epoch`` on this rank: ``len(self)``, but for an epoch resumed under
        other settings, those before the state and those its plan deals after (what the old
        ranks left: more or fewer), so that it means the whole epoch, as after an exact
        resume."""
        if self.origin is not None and self.origin[0] == epoch:
            plan = self.plan(epoch, 1)
            return plan.first_position + plan.num_batches
        return len(self)

    def remaining(self, epoch: int) -> int:
        """Batches of ``epoch``'s plan on this rank: ``epoch_batches`` less ``position``, from
        one plan (an elastic resume's deals every old rank's remainder)."""
        if self.origin is not None and self.origin[0] == epoch:
            return self.plan(epoch, 1).num_batches
        return len(self)

    def position(self, epoch: int) -> int:
        """Batches of ``epoch`` before the first of its plan: those a state resumed under
        other settings had yielded, else 0."""
        if self.origin is not None and self.origin[0] == epoch:
            return self.plan(epoch, 1).first_position
        return 0

    def settings(self, num_workers: int) -> dict[str, Any]:
        """The settings that fix the order, as a saved state holds them."""
        c = self.config
        return {"batch_size": c.batch_size, "shuffle": c.shuffle, "seed": c.seed,
                "drop_last": c.drop_last, "shuffle_window_rows": self.window_rows,
                "world_size": c.world.world_size, "num_workers": max(1, num_workers)}

    def agreed(self) -> dict[str, Any]:
        """What every rank must agree on for its share of each epoch (``_agree.py``)."""
        c = self.config
        return {"dataset": self.fingerprint, "batch_size": c.batch_size,
                "drop_last": c.drop_last, "shuffle": c.shuffle,
                "seed": c.seed if c.shuffle else None}

    def plan(self, epoch: int, num_workers: int) -> RankPlan:
        """This rank's plan of ``epoch`` with ``num_workers`` workers."""
        c = self.config
        if self.origin is not None and self.origin[0] == epoch:
            # Kept: len(loader) asks for it, and dealing what old ranks left took seconds
            # (3.8 s a call for 20M rows, 4M-row windows, 3 ranks resumed as 2: found in review)
            key = json.dumps([epoch, self.settings(num_workers), self.origin[1], c.world.rank],
                             sort_keys=True)
            plan = self._remainders.get(key)
            if plan is None:
                if len(self._remainders) > 4:  # one resumed epoch's, by num_workers: a few
                    self._remainders.clear()
                plan = self._remainders[key] = self._deal_remainder(
                    epoch, self.origin[1], self.settings(num_workers), c.world.rank)
            return plan
        return plan_epoch(
            self.dataset._discovery.num_rows, batch_size=c.batch_size, rank=c.world.rank,
            world_size=c.world.world_size, num_workers=num_workers, seed=c.seed, epoch=epoch,
            shuffle=c.shuffle, drop_last=c.drop_last, window_rows=self.window_rows,
        )

    def level(self, epoch: int, settings: Mapping[str, Any],
              origin: Mapping[str, Any] | None) -> list[RankPlan]:
        """Every rank's plan of ``epoch`` under saved ``settings`` (and their own origin).

        Made once per level and kept: each rank's remainder needs every old rank's plan, so
        remaking them took world_size ** depth plans for a chain of elastic resumes (4.6 s at
        depth 2 over 16 ranks, minutes at 64)."""
        key = json.dumps([epoch, settings, origin], sort_keys=True)
        plans = self._levels.get(key)
        if plans is None:
            if len(self._levels) > 64:  # the levels of one chain, one epoch: a few
                self._levels.clear()
            plans = self._levels[key] = self._level(epoch, settings, origin)
        return plans

    def _level(self, epoch: int, settings: Mapping[str, Any],
               origin: Mapping[str, Any] | None) -> list[RankPlan]:
        s = settings
        if origin is None:
            return [plan_epoch(
                self.dataset._discovery.num_rows, batch_size=s["batch_size"], rank=r,
                world_size=s["world_size"], num_workers=s["num_workers"], seed=s["seed"],
                epoch=epoch, shuffle=s["shuffle"], drop_last=s["drop_last"],
                window_rows=s["shuffle_window_rows"],
            ) for r in range(s["world_size"])]
        return [self._deal_remainder(epoch, origin, s, r) for r in range(s["world_size"])]

    def _deal_remainder(self, epoch: int, origin: Mapping[str, Any],
                        settings: Mapping[str, Any], rank: int) -> RankPlan:
        old = self.level(epoch, origin["settings"], origin.get("resumed_from"))
        if origin["batches"] > old[0].num_batches:  # a damaged state: rows would be lost
            raise StateMismatchError(
                f"the state's resumed_from.batches={origin['batches']} (at some depth of the "
                f"chain) is past its plan's {old[0].num_batches} batches per rank; the state is "
                "damaged")
        # This rank's rows, then cut to its window size, then dealt to its workers; the rows
        # stay those that every other rank leaves it, whatever their own windows or workers.
        # A state saved before (neither key): all three at once, the plan it was made with.
        if origin.get("own"):  # the same ranks: each deals out its own rows left
            left, at, world = own_remaining(old[rank], origin["batches"]), 0, 1
        elif origin.get("shares"):
            left, at, world = rank_share(
                remaining(old, origin["batches"]), batch_size=settings["batch_size"],
                rank=rank, world_size=settings["world_size"], drop_last=settings["drop_last"],
            ), 0, 1
        else:
            left, at, world = remaining(old, origin["batches"]), rank, settings["world_size"]
        if origin.get("recut"):  # (states saved before it was: the old windows, as then)
            left = recut(left, settings["shuffle_window_rows"])
        return plan_remainder(
            left, batch_size=settings["batch_size"], rank=at, world_size=world,
            num_workers=settings["num_workers"], drop_last=settings["drop_last"],
            first_position=old[0].first_position + origin["batches"],
        )

    def shared(self, plan: RankPlan, epoch: int, start: int, ahead: int) -> SharedStream:
        """A one-worker plan's batches past the first ``start``, for several threads to make,
        with ``ahead`` windows read ahead."""
        stages, rank, first = self.stages, self.config.world.rank, plan.first_position

        def make(item: tuple[int, Any]) -> Any:
            return finish(stages, *item, epoch=epoch, rank=rank, first_position=first)

        raw = raw_batches(stages, plan.workers[0], skip=start, ahead=ahead)
        return SharedStream(raw, start=start, finish=make)

    def batches(self, plan: RankPlan, worker: int, epoch: int, start: int = 0) -> Iterator[Any]:
        """Worker ``worker``'s batches, past those among the rank's first ``start``."""
        return worker_batches(self.stages, plan.workers[worker], epoch=epoch,
                              rank=self.config.world.rank,
                              skip=skipped(worker, start, len(plan.workers)),
                              first_position=plan.first_position)


# to_torch()'s keywords beyond its own: the plan's settings, as for pqloader.DataLoader
_OPTIONS = frozenset({"shuffle_window_rows", "transform", "collate_fn", "memory_budget_bytes"})
_TORCH_LOADER = frozenset({"num_workers", "pin_memory", "timeout", "worker_init_fn",
                           "persistent_workers", "prefetch_factor", "multiprocessing_context"})


class TorchIterable(torch.utils.data.IterableDataset[Any]):
    """Batches of one rank; under torch's worker processes each worker makes its share.

    Use with ``torch.utils.data.DataLoader(it, batch_size=None, num_workers=N)``. Call
    :meth:`set_epoch` before each epoch, as with ``DistributedSampler``; it reaches persistent
    workers too.
    """

    def __init__(self, dataset: ParquetDataset, *, batch_size: int, shuffle: bool = False,
                 seed: int = 0, drop_last: bool = False, rank: int | None = None,
                 world_size: int | None = None, **options: Any) -> None:
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            where = " (torch's DataLoader takes it: this is its dataset)" \
                if unknown[0] in _TORCH_LOADER else ""
            raise InvalidArgumentError(
                f"to_torch() got an unexpected keyword {unknown[0]!r}{where}; it takes "
                f"batch_size, shuffle, seed, drop_last, rank, world_size, "
                f"{', '.join(sorted(_OPTIONS))}")
        config = LoaderConfig(batch_size=batch_size, shuffle=shuffle, seed=seed,
                              drop_last=drop_last, world=resolve_world(rank, world_size),
                              **options)
        self._planner = Planner(dataset, config)
        self._cursor = SharedCursor()
        # do the ranks plan alike? (_agree.py) Asked in this process, never in torch's
        # workers: at set_epoch and len(), and while it iterates here (num_workers=0). Rank 0
        # publishes now, and the others' first look waits for it
        self._agreement: Agreement | None = Agreement(config.world, built_at(2))
        self._agreement.begin(self._planner.agreed())

    def __getstate__(self) -> dict[str, Any]:
        # Pickled in the parent for spawn and forkserver workers, where the process group
        # shows: a spawned worker has none, so its own check in __iter__ passed, and every
        # rank read every row.
        check_world(self._planner.config.world, "dataset (ds.to_torch())")
        return {**self.__dict__, "_agreement": None}

    def _check_ranks(self, *, now: bool, wait: bool = True) -> None:
        """Compare with rank 0 (_agree.py); the first look before an epoch (``wait``) waits
        for rank 0's plan. ``len()`` does not: called for a progress bar or a scheduler's
        steps, it stalled 30 s where rank 0 builds no such loader (found in review)."""
        if self._agreement is not None:
            self._agreement.begin(self._planner.agreed())
            if wait:
                self._agreement.wait_for_rank0(FIRST_WAIT_S)
            self._agreement.poll(now=now)

    @classmethod
    def from_planner(cls, planner: Planner) -> TorchIterable:
        """The iterable of an already validated loader (no second validation)."""
        self = cls.__new__(cls)
        self._planner = planner
        self._cursor = SharedCursor()
        self._agreement = None  # the loader's own checks
        return self

    def set_epoch(self, epoch: int, start: int = 0, *, num_workers: int | None = None) -> None:
        """The epoch of the next iterations, and when resuming, the batches of it to skip:
        ``start``, those torch's ``DataLoader`` yielded with ``num_workers`` workers (the
        plan deals batches to workers: another count would repeat and lose rows, so it is
        refused; ``pqloader.DataLoader``'s ``state_dict`` resumes under any). Both hold for
        every pass until the next call (a second pass without one skips the same batches
        again: torch's workers share no end of a pass to clear it), so call it at each
        epoch, as with torch's ``DistributedSampler``."""
        check_positive("epoch", epoch, allow_zero=True)
        check_positive("start", start, allow_zero=True)
        batches = self._planner.remaining(epoch)
        if start > batches:
            raise InvalidArgumentError(
                f"start={start} is past the epoch's {batches} batches on this rank")
        if start and num_workers is None:
            raise InvalidArgumentError(
                f"set_epoch(..., start={start}) needs num_workers=: the num_workers of the "
                "torch DataLoader those batches came from (the plan deals batches to its "
                "workers)")
        if num_workers is not None:
            check_positive("num_workers", num_workers, allow_zero=True)
        self._check_ranks(now=True)
        self._cursor.set(epoch, start, max(1, num_workers or 0) if start else 0)

    def __len__(self) -> int:
        """Batches of this epoch on this rank (over all of torch's workers together)."""
        self._check_ranks(now=False, wait=False)
        return self._planner.epoch_batches(self._cursor.get()[0])

    def __iter__(self) -> Iterator[Any]:
        """This process's batches of the epoch (a torch worker's share): after an error, the
        next ``next`` raises :class:`IncompleteEpochError`, as a pqloader DataLoader's pass
        does (a generator's plain end had torch end the epoch short without a word: found by
        fuzzing; with torch's workers, the others' batches still come)."""
        worker = torch.utils.data.get_worker_info() is not None
        return Pass(self._pass(), None, (
            # torch's other workers go on: their batches came out of turn, so no start=k
            # resumes (following that lost 8 rows and repeated 8: found in review)
            "(That count is this torch worker's; the others went on.) Iterate again to start "
            "the epoch over, or use pqloader.DataLoader, whose state_dict() goes on from a "
            "failed batch" if worker else "Call set_epoch(epoch, start=k), k the batches "
            "your loop received, to go on from the failed one, or iterate again to start the "
            "epoch over"), before=0 if worker else self._cursor.get()[1])

    def _pass(self) -> Generator[Any, None, None]:
        check_world(self._planner.config.world, "dataset (ds.to_torch())")
        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        epoch, start, counted = self._cursor.get()
        if counted and counted != workers:
            raise InvalidArgumentError(
                f"set_epoch(..., start={start}) counts batches of {counted} torch worker(s) "
                f"(num_workers={counted if counted > 1 else '0 or 1'}), and this DataLoader "
                f"has {workers}: the rows of the two plans differ, and some would come twice, "
                "others never. Resume with the same num_workers, or use pqloader.DataLoader, "
                "whose state_dict resumes under any")
        if (memory := self._planner.stages.memory) is not None:
            if info is not None:
                raise InvalidArgumentError(
                    "memory_budget_bytes is held in one process: torch's worker processes each "
                    "count pages they share with the parent and copy on write, which their own "
                    "RSS does not show. Iterate with num_workers=0, use pqloader.DataLoader "
                    "(thread workers), or size shuffle_window_rows yourself"
                )
            memory.start()
        plan = self._planner.plan(epoch, workers)
        # torch collects round-robin from its worker 0; after ``start`` batches the next one
        # belongs to plan worker start % workers, so torch's worker i plays that one + i.
        batches = self._planner.batches(plan, (worker + start) % workers, epoch, start)
        if info is None:
            self._check_ranks(now=True)
            for batch in batches:
                if memory is not None:
                    memory.warn_if_over()
                yield batch
                self._check_ranks(now=False)
        elif self._planner.stages.audit:  # (batch, row numbers) pairs
            for batch, rows in batches:
                yield compact(batch), rows
        else:
            yield from map(compact, batches)
