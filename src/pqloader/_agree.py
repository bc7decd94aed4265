"""Do the ranks plan alike? Checked through ``torch.distributed``'s store, never a collective.

Every rank computes its share of an epoch alone, from the dataset and the settings: exactly
once and equal batch counts hold only if every rank has the same files, in the same order, and
the same seed, batch size and ``drop_last``, and passes its own rank. A rank that listed a folder
while a writer was still adding to it, a list built from a set, ``seed=base + rank`` or
``rank=LOCAL_RANK`` on a second node made ranks repeat and lose rows silently, or yield unequal
batch counts (DDP then hangs at the epoch's end).

When a loader over the process group's ranks first iterates, rank 0 publishes what fixes its
plan in the group's store, with a fresh token; every other rank, while it delivers, looks (at
most every ``POLL_S``, without waiting) whether rank 0 has, and once it has, compares, once: a
rank that differs raises and counts itself under rank 0's token, which rank 0 looks at in turn
and raises too. One key per rank and loader: no rank reads all ranks' keys (thousands of ranks
would overload the store). A collective could hang (a loader only some ranks iterate) or
interleave with the training's own collectives.

Loaders are matched across ranks by the order they were built in (those over the group's world
size). Keys outlive a torchrun restart (its store does): a value rank 0 published before this
process started is from an earlier run, and waited past. ``PQLOADER_CHECK_RANKS=0`` turns the
check off. Not checked: the epoch and the cursor (a rank may peek at a batch before training),
and ``ds.to_torch()`` (its workers are processes torch forks). If the process that holds the
store (rank 0's, under ``init_method="tcp://"``) is stopped, a look waits as a collective would.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import time
import uuid
from collections.abc import Mapping
from typing import Any

from ._errors import InvalidArgumentError
from ._world import World

POLL_S = 0.2  # a look costs a round trip to rank 0's store (~0.07 ms)
_LOADERS = itertools.count()  # loaders over the group's ranks built in this process
_OFF = "PQLOADER_CHECK_RANKS=0 turns this check off"
_LOADED = time.time()


class Agreement:
    """One loader's check that every rank plans as rank 0 does (see the module docstring)."""

    def __init__(self, world: World) -> None:
        self._world = world
        self._key = ""  # none: not checked
        self._told: str | None = None  # what a rank was told: told again at each pass
        self._polling = False
        self._next = 0.0
        self._watch = ""  # rank 0: where the other ranks count themselves
        self._terms: dict[str, Any] = {}
        group = _group()
        if group is None or group[1] != world.world_size or world.world_size < 2:
            return
        index = next(_LOADERS)
        if group[0] != world.rank:  # rank=LOCAL_RANK: every node's first process is rank 0
            self._told = (
                f"this process is rank {group[0]} of the process group but its loader was "
                f"given rank={world.rank} (of world_size={world.world_size}, the group's size), "
                f"so two processes would read rank {world.rank}'s rows and none rank "
                f"{group[0]}'s: pass rank=torch.distributed.get_rank() (the global rank, not "
                "LOCAL_RANK), or no rank= and world_size= to take them from the group. If the "
                f"ranks are numbered apart on purpose, {_OFF}")
            return
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
        self._key = f"pqloader/agree/{world.world_size}/{restart}/{index}"

    def begin(self, terms: Mapping[str, Any]) -> None:
        """This rank plans from ``terms`` (JSON types; the same at every pass). Rank 0
        publishes them, at the first pass."""
        if self._told is not None:
            raise InvalidArgumentError(self._told)
        if not self._key or self._polling:
            return
        self._terms = dict(terms)
        if self._world.rank == 0:
            token = uuid.uuid4().hex
            value = {"time": time.time(), "token": token, "terms": self._terms}
            try:
                _store().set(self._key, json.dumps(value))
            except Exception:  # private API, a group destroyed, a store gone: never stop
                return  # training for the check
            self._watch = f"{self._key}/{token}"
        self._polling, self._next = True, 0.0

    def poll(self, *, now: bool = False) -> None:
        """Compare with rank 0, or (rank 0) look whether a rank differed: raises if so. At most
        every ``POLL_S``, unless ``now`` (a pass's end)."""
        if not self._polling or ((t := time.monotonic()) < self._next and not now):
            return
        self._next = t + POLL_S
        try:
            told = self._look() if self._world.rank == 0 else self._compare()
        except Exception:  # as in begin
            self._polling, told = False, None
        if told is not None:
            self._told, self._polling = told, False
            raise InvalidArgumentError(told)

    def _compare(self) -> str | None:
        """A rank but 0: compare with rank 0's terms once they are published."""
        store = _store()
        if not store.check([self._key]):
            return None
        value = json.loads(store.get(self._key))
        if value["time"] < _started():
            return None  # rank 0 of an earlier run, before a restart: this run's is to come
        self._polling = False  # compared: done
        told = compare(self._terms, value["terms"], self._world.rank)
        watch = f"{self._key}/{value['token']}"
        if told is not None:
            store.set(f"{watch}/told", told)
        store.add(f"{watch}/{'differ' if told else 'agree'}", 1)
        return told

    def _look(self) -> str | None:
        """Rank 0: have the other ranks compared, and did one differ?"""
        store = _store()
        differ, agree = (store.add(f"{self._watch}/{k}", 0) for k in ("differ", "agree"))
        if differ:
            told = store.get(f"{self._watch}/told").decode()
            return (f"{differ} of the other {self._world.world_size - 1} ranks plan "
                    f"differently from rank 0; one was told: {told}")
        if agree >= self._world.world_size - 1:
            self._polling = False
        return None


def compare(mine: Mapping[str, Any], first: Mapping[str, Any], rank: int) -> str | None:
    """What to tell rank ``rank``, whose terms are ``mine``, if they differ from rank 0's
    (``first``); ``None`` if they agree."""
    for name, value in mine.items():
        if first.get(name) != value:
            counts = "" if name in ("seed", "shuffle") else (
                ", or the ranks' batch counts differ (DDP hangs at the epoch's end)")
            return (f"rank {rank} plans differently from rank 0, so rows would repeat or go "
                    f"missing{counts}: rank {rank} has {_show(name, value, first.get(name))}, "
                    f"rank 0 {_show(name, first.get(name), value)}. "
                    + _ADVICE.get(name, f"Pass the same {name}= on every rank.")
                    + " (Loaders are matched across ranks by the order they were built in: "
                    f"build them in one order on every rank. {_OFF}.)")
    return None


_ADVICE = {
    "dataset": "Open the same files in the same order on every rank: list them once the writer "
               "is done, or pass every rank the same list and filter.",
    "seed": "Pass the same seed= on every rank: the random numbers transforms get already "
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
