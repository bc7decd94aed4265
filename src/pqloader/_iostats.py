"""The counts of a store's remote IO, shared by the process that opened it and its workers."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
import sys
import threading
from typing import Any

_COUNTERS = ("requests", "bytes", "retries", "throttled", "timeouts", "cache_hits",
             "cache_misses", "cache_corrupt")
_ROWS = 1024  # row 0: the process that opened the dataset; then one per worker process


class IOStats:
    """What a store's IO did, for ``ds.io_stats()``: thread-safe counters in shared memory.

    Row 0 counts the process that made the store (its worker threads too). A worker process,
    forked or spawned with the dataset, counts in a row of its own in the same memory (torch's
    worker id picks it; else the process id), so the parent's totals include its workers'. The
    counters:

    - ``requests``: GETs that returned data (retries not counted here); ``bytes`` fetched;
    - ``retries``: requests repeated after a transient error; ``throttled``: of which the store
      said "slow down" (503 SlowDown, 429); ``timeouts``: abandoned after the per-request
      timeout;
    - ``cache_hits``, ``cache_misses``; ``cache_corrupt``: entries that failed their checksum
      and were fetched again.

    ``concurrency``, the adaptive request limit now, is this process's own.
    """

    def __init__(self, values: Any = None, owner: int | None = None) -> None:
        self._values = values if values is not None else \
            multiprocessing.RawArray("q", _ROWS * len(_COUNTERS))
        self._owner = os.getpid() if owner is None else owner
        self.concurrency = 0
        self._attach()

    def _attach(self) -> None:
        """Count in this process's row, with a lock of this process (not a forked copy)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        slot = 0 if self._pid == self._owner else 1 + _worker_slot() % (_ROWS - 1)
        self._base = slot * len(_COUNTERS)

    def __getstate__(self) -> dict[str, Any]:
        # Shared memory passes only to a process being started (spawn, forkserver); any other
        # copy (a pickled dataset) counts on its own.
        spawning = multiprocessing.context.get_spawning_popen() is not None
        return {"values": self._values if spawning else None,
                "owner": self._owner if spawning else None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["values"], state["owner"])  # type: ignore[misc]
        self._pid = -1  # pick the row at the first count: torch's worker id is not set yet

    def add(self, **counts: int) -> None:
        if self._pid != os.getpid():  # forked
            self._attach()
        with self._lock:
            for name, n in counts.items():
                self._values[self._base + _COUNTERS.index(name)] += n

    def as_dict(self) -> dict[str, int]:
        """Every process's counts added up, and this process's ``concurrency``."""
        width = len(_COUNTERS)
        values = self._values[:]  # one copy: a worker adding meanwhile cannot tear a row
        out = {name: sum(values[i::width]) for i, name in enumerate(_COUNTERS)}
        out["concurrency"] = self.concurrency
        return out


def _worker_slot() -> int:
    """torch's worker id in one of its worker processes, else the process id."""
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    return int(info.id) if info is not None else os.getpid()
