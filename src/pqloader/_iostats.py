"""The counts of a store's remote IO, shared by the process that opened it and its workers."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
from typing import Any

_COUNTERS = ("requests", "bytes", "retries", "throttled", "timeouts", "cache_hits",
             "cache_misses", "cache_corrupt")


class IOStats:
    """What a store's IO did, for ``ds.io_stats()``: counters in shared memory.

    The process that made the store and its worker processes, forked or spawned with the
    dataset, add to the same counters, under one lock that they share: so the parent's totals
    include its workers', and no count is lost to two processes adding at once (rows per
    process, picked by torch's worker id, collided between two loaders' workers 0). The lock
    comes from the ``spawn`` context, which can be handed to a process however it starts; a
    ``fork`` one cannot be passed to a spawned process. The counters:

    - ``requests``: GETs that returned data (retries not counted here); ``bytes`` fetched;
    - ``retries``: requests repeated after a transient error; ``throttled``: of which the store
      said "slow down" (503 SlowDown, 429); ``timeouts``: abandoned after the per-request
      timeout;
    - ``cache_hits``, ``cache_misses``; ``cache_corrupt``: entries that failed their checksum
      and were fetched again.

    ``concurrency``, the adaptive request limit now, is this process's own.
    """

    def __init__(self, values: Any = None, lock: Any = None) -> None:
        self._values = values if values is not None else \
            multiprocessing.RawArray("q", len(_COUNTERS))
        self._lock = lock if lock is not None else multiprocessing.get_context("spawn").Lock()
        self.concurrency = 0

    def __getstate__(self) -> dict[str, Any]:
        # Shared memory and locks pass only to a process being started (spawn, forkserver);
        # any other copy (a pickled dataset) counts on its own.
        spawning = multiprocessing.context.get_spawning_popen() is not None
        return {"values": self._values if spawning else None,
                "lock": self._lock if spawning else None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["values"], state["lock"])  # type: ignore[misc]

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                self._values[_COUNTERS.index(name)] += n

    def as_dict(self) -> dict[str, int]:
        """The counts of this process and its workers, and this process's ``concurrency``."""
        with self._lock:
            values = self._values[:]
        out = dict(zip(_COUNTERS, values, strict=True))
        out["concurrency"] = self.concurrency
        return out
