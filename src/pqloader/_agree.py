"""Do the ranks plan alike? Checked through ``torch.distributed``'s store, never a collective.

Every rank computes its share of an epoch alone, from the dataset and the settings: exactly
once and equal batch counts hold only if every rank has the same files, in the same order, and
the same seed, batch size and ``drop_last``, and passes its own rank. A rank that listed a folder
while a writer was still adding to it, a list built from a set, ``seed=base + rank`` or
``rank=LOCAL_RANK`` on a second node made ranks repeat and lose rows silently, or yield unequal
batch counts (DDP then hangs at the epoch's end).

When a loader over the process group's ranks first iterates, rank 0 publishes what fixes its
plan in the group's store, with a fresh token; every other rank, while it delivers, looks
(without waiting; every ``POLL_S`` at first, less often while nothing changes, and at each pass
end) whether rank 0 has, and once it has, compares, once per loader: a rank that differs raises
and counts itself under rank 0's token, which rank 0 looks at in turn and raises too. One key
per rank and loader: no rank reads all ranks' keys (thousands of ranks would overload the
store). A collective could hang (a loader only some ranks iterate) or interleave with the
training's own collectives.

Loaders are matched across ranks by where they were built (the caller's file and line) and, for
one place, by the order they were built in there. Keys outlive a torchrun restart (its store
does): the key holds the restart count, and a value rank 0 published before this process started
(``STALE_S`` of clock skew between nodes allowed) is from an earlier run, and waited past.
``PQLOADER_CHECK_RANKS=0`` turns the check off.

Not told: ranks whose only pass ends before rank 0 publishes; rank 0 if its last pass ends before
the others compare (each rank that differs is told); the epoch and the cursor (a rank may peek at
a batch before training). ``ds.to_torch()`` is checked in the process that holds it, never in
torch's workers: at ``set_epoch`` and ``len()``, and at each batch it makes itself
(``num_workers=0``). Its rank 0 publishes as it is built, and the other ranks' first look at
``set_epoch`` or an iteration waits for that (up to ``FIRST_WAIT_S``, then warned of): under
torch's workers no later look may come within the epoch. If the process that holds the store
(rank 0's, under ``init_method="tcp://"``) is stopped, a look waits as a collective would.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import sys
import time
import uuid
import warnings
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

from ._errors import InvalidArgumentError
from ._world import World

POLL_S = 0.2  # the first looks' interval; a look is a round trip to the store (~0.07 ms)
MAX_POLL_S = 5.0  # while nothing changes, the interval doubles up to this
STALE_S = 30.0  # clock skew allowed between nodes when telling this run's values from older
FIRST_WAIT_S = 30.0  # how long a rank's first look at a to_torch() waits for rank 0's plan
WAIT_POLL_S = 0.02
_BUILT: defaultdict[str, Iterator[int]] = defaultdict(itertools.count)  # per place built
_OFF = "PQLOADER_CHECK_RANKS=0 turns this check off"
_LOADED = time.time()


class Agreement:
    """One loader's check that every rank plans as rank 0 does (see the module docstring).
    ``where``: the place the loader was built (its caller's file and line)."""

    def __init__(self, world: World, where: str) -> None:
        self._world = world
        self._where = where
        self._key = ""  # none: not checked, or checked already
        self._told: str | None = None  # what a rank was told: told again at each pass
        self._polling = False
        self._next = 0.0
        self._interval = POLL_S
        self._watch = ""  # rank 0: where the other ranks count themselves
        self._terms: dict[str, Any] = {}
        self._alike: dict[str, Any] = {}  # settings ranks may differ in (see alike())
        self._known: bool | None = None  # alike()'s answer, once known
        self.compared = False  # whether the ranks are compared through the store at all
        self._waited = False  # wait_for_rank0() ran
        group = _group()
        if group is None or group[1] != world.world_size or world.world_size < 2:
            return
        index = next(_BUILT[where])
        if group[0] != world.rank:  # rank=LOCAL_RANK: every node's first process is rank 0
            self._told = (
                f"this process is rank {group[0]} of the process group but its loader (built "
                f"at {where}) was given rank={world.rank} of world_size={world.world_size}, "
                f"the group's size, so two processes would read rank {world.rank}'s rows and "
                f"none rank {group[0]}'s: pass rank=torch.distributed.get_rank() (the global "
                "rank, not LOCAL_RANK), or no rank= and world_size= to take them from the "
                f"group. If the ranks are numbered apart on purpose, {_OFF}")
            return
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
        self._key = f"pqloader/agree/{world.world_size}/{restart}/{where}/{index}"
        self.compared = True

    def begin(self, terms: Mapping[str, Any], alike: Mapping[str, Any] | None = None) -> None:
        """This rank plans from ``terms`` (JSON types; the same at every pass). Rank 0
        publishes them, at the first pass. ``alike``: settings the ranks may differ in, but
        then a state saved by one rank restores none other (:meth:`alike`)."""
        if self._told is not None:
            raise InvalidArgumentError(self._told)
        if not self._key or self._polling:
            return
        self._terms, self._alike = dict(terms), dict(alike or {})
        if self._world.rank == 0:
            token = uuid.uuid4().hex
            value = {"time": time.time(), "token": token, "terms": self._terms,
                     "alike": self._alike}
            try:
                _store().set(self._key, json.dumps(value))
            except Exception:  # private API, a group destroyed, a store gone: never stop
                self._key, self.compared = "", False  # training for the check
                return
            self._watch = f"{self._key}/{token}"
        self._polling, self._next = True, 0.0

    def poll(self, *, now: bool = False) -> None:
        """Compare with rank 0, or (rank 0) look whether a rank differed: raises if so. Not
        before the next look is due, unless ``now`` (a pass's end)."""
        if not self._polling or ((t := time.monotonic()) < self._next and not now):
            return
        self._interval = min(MAX_POLL_S, self._interval * 2) if self._next else POLL_S
        self._next = t + self._interval
        try:
            told = self._look() if self._world.rank == 0 else self._compare()
        except Exception:  # as in begin
            told = None
            self._done()
            self.compared = self._known is not None  # unknown for good: as if never checked
        if told is not None:
            self._told, self._polling = told, False
            raise InvalidArgumentError(told)

    def wait_for_rank0(self, seconds: float) -> None:
        """A rank but 0, at its first look: compare now, waiting up to ``seconds`` for rank 0
        to publish (warned of past them; compared at a later look then). For ``to_torch()``
        under torch's workers, whose ranks look only at ``set_epoch`` and ``len()``: looking
        without waiting, a rank that got there before rank 0 (rank 0 setting up its logging)
        ran its epoch unchecked, rows repeated and lost, or its batch count differing until
        a collective timed out (found in review)."""
        if not self._polling or self._world.rank == 0 or self._waited:
            return
        self._waited = True
        deadline = time.monotonic() + seconds
        while True:
            self.poll(now=True)  # raises if this rank differs
            if not self._polling:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(WAIT_POLL_S)
        warnings.warn(
            f"rank {self._world.rank}: rank 0 has not published its plan of the loader built "
            f"at {self._where} within {seconds:g} s, so whether the ranks plan alike is not "
            "known yet (it is looked at again at the next set_epoch or len()); build the "
            f"loader at the same place on every rank. {_OFF}", RuntimeWarning, stacklevel=4)

    def _done(self) -> None:
        self._polling, self._key = False, ""  # once per loader

    def _compare(self) -> str | None:
        """A rank but 0: compare with rank 0's terms once they are published."""
        store = _store()
        if not store.check([self._key]):
            return None
        value = json.loads(store.get(self._key))
        if value["time"] < _started() - STALE_S:
            return None  # rank 0 of an earlier run, before a restart: this run's is to come
        watch = f"{self._key}/{value['token']}"
        self._done()
        told = compare(self._terms, value["terms"], self._world.rank, self._where)
        try:
            if told is None and value.get("alike", {}) != self._alike:
                self._known = False  # counted before "agree": rank 0 then knows
                store.add(f"{watch}/unlike", 1)
            if told is not None:
                store.set(f"{watch}/told", told)
            store.add(f"{watch}/{'differ' if told else 'agree'}", 1)
        except Exception:  # rank 0 not told: this rank still is
            pass
        return told

    def _look(self) -> str | None:
        """Rank 0: have the other ranks compared, and did one differ?"""
        store = _store()
        differ, agree = (store.add(f"{self._watch}/{k}", 0) for k in ("differ", "agree"))
        if differ:
            told = store.get(f"{self._watch}/told").decode()
            return (f"{'a rank' if differ == 1 else f'{differ} ranks'} (so far) plan"
                    f"{'s' if differ == 1 else ''} differently from rank 0; one was told: "
                    f"{told}")
        if agree >= self._world.world_size - 1:
            self._done()
        return None


    def alike(self) -> bool | None:
        """Whether every rank has rank 0's ``alike`` settings: ``None`` while unknown (no
        process group, or not every rank has compared yet; a rank but 0 knows only whether it
        differs itself)."""
        if self._known is not None or self._world.world_size < 2:
            return True if self._known is None else self._known
        if not self._watch:  # a rank but 0, alike so far; or no check
            return None
        try:
            store = _store()
            # "agree" first: a rank counts itself under "unlike" before "agree", so every rank
            # counted in this "agree" is in the "unlike" read after it (read the other way,
            # a rank comparing between the two reads was taken for alike)
            agree, unlike = (store.add(f"{self._watch}/{k}", 0) for k in ("agree", "unlike"))
        except Exception:  # as in begin
            return None
        if unlike:
            self._known = False
        elif agree >= self._world.world_size - 1:
            self._known = True
        return self._known


def compare(mine: Mapping[str, Any], first: Mapping[str, Any], rank: int,
            where: str = "") -> str | None:
    """What to tell rank ``rank``, whose terms are ``mine``, if they differ from rank 0's
    (``first``) for the loader built at ``where``; ``None`` if they agree."""
    for name, value in mine.items():
        if first.get(name) != value:
            built = f" built at {where}" if where else ""
            return (f"rank {rank} plans the loader{built} differently from rank 0, so "
                    f"{_HARM.get(name, _HARM['dataset'])}: rank {rank} has "
                    f"{_show(name, value, first.get(name))}, rank 0 "
                    f"{_show(name, first.get(name), value)}. "
                    + _ADVICE.get(name, f"Pass the same {name}= on every rank.")
                    + " (Unless rank 0's is another loader: loaders are matched by where they "
                    "were built and, at one place, by the order they were built in there; "
                    f"build them alike on every rank. {_OFF}.)")
    return None


_HARM = {
    "dataset": "rows would repeat or go missing, or the ranks' batch counts differ (DDP hangs "
               "at the epoch's end)",
    "seed": "rows would repeat or go missing",
    "shuffle": "rows would repeat or go missing",
    "batch_size": "the ranks' batch counts differ (DDP hangs at the epoch's end)",
}
_ADVICE = {
    "dataset": "Open the same files in the same order on every rank: list them once the writer "
               "is done, or pass every rank the same list and filter.",
    "seed": "Pass the same seed= on every rank: the random numbers that transforms get already "
            "differ by rank.",
}


def _show(name: str, value: Any, other: Any) -> str:
    if name != "dataset" or not isinstance(value, dict) or not isinstance(other, dict):
        return f"{name}={value!r}"
    counts = (value.get("files"), value.get("rows"))
    if counts != (other.get("files"), other.get("rows")):
        return f"{counts[0]:,} files of {counts[1]:,} rows"
    return (f"{counts[0]:,} files of {counts[1]:,} rows with digest {value.get('digest')} (of "
            "names, order, sizes, row groups, schema and filter)")


def _store() -> Any:
    """The default process group's store (a private torch API; it may move: then no check)."""
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


def _group() -> tuple[int, int] | None:
    """(rank, world size) of an initialised default process group, unless the check is off."""
    if os.environ.get("PQLOADER_CHECK_RANKS", "1").strip() in ("0", "false", "no", "off"):
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_rank(), dist.get_world_size()


def built_at(depth: int) -> str:
    """The file (its name) and line ``depth`` frames up the caller's stack: where a loader was
    built, the same on every rank (every rank runs the same script, from any folder)."""
    frame = sys._getframe(depth + 1)
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


@functools.cache
def _started() -> float:
    """When this process started, in seconds since the epoch (Linux: from ``/proc``; else
    when pqloader was imported, which is later)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return _LOADED
