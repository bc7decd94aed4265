"""The counts of a store's remote IO, shared by the process that opened it and its workers."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
import threading
from typing import Any

_COUNTERS = ("requests", "bytes", "retries", "throttled", "timeouts", "cache_hits",
             "cache_misses", "cache_corrupt")
_ROWS = 1024  # row 0: the process that opened the dataset; then one per worker process
_CLAIM_TIMEOUT_S = 5.0


class IOStats:
    """What a store's IO did, for ``ds.io_stats()``: counters in shared memory.

    Row 0 counts the process that made the store (its worker threads too). A worker process,
    forked or spawned with the dataset, claims a row of its own in the same memory at its first
    count, so the parent's totals include its workers' and no two processes add to one row.
    (Rows picked by torch's worker id collided: two loaders' workers 0 lost ~13% of their
    counts.) Only the claim takes a lock shared between processes, once per process: a worker
    killed while counting (a stuck one stopped, the OOM killer) cannot leave a lock held that
    every other count would wait on. The lock comes from the ``spawn`` context, which can be
    handed to a process however it starts. The counters:

    - ``requests``: GETs that returned data (retries not counted here); ``bytes`` fetched;
    - ``retries``: requests repeated after a transient error; ``throttled``: of which the store
      said "slow down" (503 SlowDown, 429); ``timeouts``: abandoned after the per-request
      timeout;
    - ``cache_hits``, ``cache_misses``; ``cache_corrupt``: entries that failed their checksum
      and were fetched again.

    ``concurrency``, the adaptive request limit now, is this process's own.
    """

    def __init__(self, shared: Any = None) -> None:
        if shared is None:  # the counters, the next row to claim, the lock for claiming it
            shared = (multiprocessing.RawArray("q", _ROWS * len(_COUNTERS)),
                      multiprocessing.RawValue("q", 1),
                      multiprocessing.get_context("spawn").Lock())
            self._pid = os.getpid()  # the owner: row 0
        else:
            self._pid = -1  # a worker: claims its row at its first count
        self._shared = shared
        self._values, self._next, self._claim = shared
        self._base = 0
        self._lock = threading.Lock()  # this process's threads, in its row
        self.concurrency = 0

    def __getstate__(self) -> dict[str, Any]:
        # Shared memory and locks pass only to a process being started (spawn, forkserver);
        # any other copy (a pickled dataset) counts on its own.
        spawning = multiprocessing.context.get_spawning_popen() is not None
        return {"shared": self._shared if spawning else None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["shared"])  # type: ignore[misc]

    def _attach(self) -> None:
        """This process's row: claimed once, under the shared lock (a forked child, or a
        spawned worker at its first count)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()  # not a copy a forked thread may have held
        row = None
        if self._claim.acquire(timeout=_CLAIM_TIMEOUT_S):
            try:
                row = self._next.value
                self._next.value = row + 1
            finally:
                self._claim.release()
        if row is None:  # a process killed while claiming holds the lock: share a row
            row = os.getpid()
        self._base = (1 + (row - 1) % (_ROWS - 1)) * len(_COUNTERS)  # past 1023: rows shared

    def add(self, **counts: int) -> None:
        if self._pid != os.getpid():  # forked, or spawned and counting for the first time
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
