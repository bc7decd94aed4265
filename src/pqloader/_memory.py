"""``memory_budget_bytes``: the resident memory a loader may add, sized up front and held at run.

Two parts:

- **Sizing** (:func:`window_bytes`): the shuffle window, the loader's one big buffer, is cut so
  that every worker stream's windows fit in the budget together, less a reserve for the rest: a
  stream holds up to about four windows at once (the one being cut into batches, the previous
  one while batches of it wait in the prefetch queue, and the next one being read and permuted,
  which needs its Arrow table and its permuted copy), and one more is counted for slack.
- **Holding** (:class:`MemoryBudget`): the real resident set (RSS, read from ``/proc``) is
  watched: a stream reads its next window ahead only while the process has room for that
  window's own row groups (decoded, then permuted) and for the batches that may be made
  ahead, a thread makes a batch ahead only while it has room for the largest batch so far,
  and freed pages go back to the system (Arrow's
  pool and glibc's heaps) when it has not. A window or batch the caller waits for is made
  anyway (the least memory that makes progress), so the budget slows a loader down and
  never stalls it; when that least passes the budget (a large batch of heavy rows, list
  columns padded to a batch's longest row), a warning says so.

The budget counts what the loader adds: the RSS growth of the process above what it was when the
iteration began (each worker process of ``to_torch`` holds its share of its own). Memory the
training step allocates meanwhile in the same process counts too: leave it room. Measured on
W1 (8M rows, 1.1 GB decoded, 2 streams): peaks of 207-219 MiB added under a 256 MiB budget;
at the smallest budget accepted (one row group per window) the peak can pass it by ~1 row group.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import torch

WINDOWS_PER_STREAM = 5  # windows a stream may hold at once, with one for slack (see above)
RESERVE_BYTES = 48 * 2**20  # for what is not windows: threads, batches, Arrow's pool slack
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_RECHECK_S = 0.01
_FRESH_S = 0.002  # how old an RSS read room() may go by
_OVER = 1.1  # the RSS past the budget that is warned of: forced progress passes it a little


def rss_bytes() -> int | None:
    """This process's resident set size, or None where ``/proc`` is missing (not Linux)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _malloc_trim() -> Callable[[], Any]:
    """glibc's ``malloc_trim(0)``, or a no-op where the C library has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


_TRIM = _malloc_trim()


def release_unused() -> None:
    """Hand freed memory back to the system: Arrow's pool (mimalloc and jemalloc keep freed
    pages until asked) and glibc's heaps, where torch's tensors and Python's strings live:
    they kept 50-120 MiB of freed batches under a 256 MiB budget (a probe's ``mallinfo2``),
    pages the RSS counts."""
    pa.default_memory_pool().release_unused()
    _TRIM()


def nbytes(batch: Any) -> int:
    """The bytes a batch holds: its (dense, host) tensors', arrays' and strings', wherever
    they are in dicts, lists and tuples (a transform's own objects count as nothing)."""
    if isinstance(batch, torch.Tensor):  # its own values: a view of a window is no more
        return batch.numel() * batch.element_size() \
            if batch.is_cpu and batch.layout == torch.strided else 0
    if isinstance(batch, np.ndarray):
        return batch.nbytes
    if isinstance(batch, (str, bytes)):
        return len(batch)
    if isinstance(batch, Mapping):
        return sum(nbytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        if batch and isinstance(batch[0], (str, bytes)):  # a column of strings: no recursion
            return sum(map(len, batch)) + 50 * len(batch)
        return sum(nbytes(v) for v in batch)
    return 0


def window_bytes(budget_bytes: int, streams: int) -> int:
    """The decoded bytes of one shuffle window that lets ``streams`` streams fit the budget."""
    return max(0, budget_bytes - RESERVE_BYTES) // (WINDOWS_PER_STREAM * max(1, streams))


class MemoryBudget:
    """Holds a loader's budget in the one process that iterates it (thread workers or none;
    worker processes are refused, since their RSS hides the pages they copy on write).

    Args:
        budget_bytes: the RSS the loader may add above what the process held at :meth:`start`.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._baseline: int | None = None
        self._released = 0.0  # when room() last handed freed memory back
        self._warned = False
        self._watched = 0.0  # when watch() last looked
        self._read_at, self._last_used = 0.0, 0  # room()'s last RSS read, and what it said
        self.batches_ahead = 0  # bytes of the batches a delivery may make ahead (reads leave it)

    def __getstate__(self) -> dict[str, int]:
        return {"budget_bytes": self.budget_bytes}

    def __setstate__(self, state: dict[str, int]) -> None:
        self.__init__(state["budget_bytes"])  # type: ignore[misc]

    def start(self) -> None:
        """Count from now: the RSS at this moment is the baseline."""
        self._baseline = rss_bytes()

    def used(self) -> int:
        """RSS added since :meth:`start` (0 where RSS cannot be read); warns once when it
        passes the budget by more than ``_OVER``."""
        rss = rss_bytes()
        if rss is None or self._baseline is None:
            return 0
        used = max(0, rss - self._baseline)
        if used > _OVER * self.budget_bytes and not self._warned:
            self._warned = True
            warnings.warn(
                f"pqloader holds {used:,} bytes more than when the iteration began, "
                f"{used / self.budget_bytes:.2f}x memory_budget_bytes={self.budget_bytes:,}: "
                "what it needs to progress (a window for each worker stream, one being read, "
                "the batches being made and the one you hold, list columns padded to each "
                "batch's longest row), or what your loop allocates in this process meanwhile, "
                "passes the budget; give a smaller batch_size, fewer num_workers, or a "
                "larger budget", RuntimeWarning, stacklevel=2)
        return used

    def watch(self) -> None:
        """Look at the RSS (every ``_RECHECK_S`` at most, called for each batch made), so that
        a budget passed while no read waits for room is warned of too."""
        now = time.monotonic()
        if now - self._watched >= _RECHECK_S:
            self._watched = now
            self.used()

    def room(self, need_bytes: int) -> bool:
        """Whether ``need_bytes`` more fit in the budget, by an RSS read at most ``_FRESH_S``
        ago (a delivery asks several times a batch, under its lock: reading ``/proc`` each
        time took 15% of W1's rate under a budget, the reads contending with the page faults
        of the threads), once freed memory is handed back (at most every ``_RECHECK_S``: a
        trim walks the heaps)."""
        now = time.monotonic()
        if now - self._read_at > _FRESH_S:
            self._read_at, self._last_used = now, self.used()
        if self._last_used + need_bytes <= self.budget_bytes:
            return True
        if now - self._released < _RECHECK_S:
            return False
        self._released = now
        release_unused()
        self._read_at, self._last_used = time.monotonic(), self.used()
        return self._last_used + need_bytes <= self.budget_bytes

    def wait_for_room(self, need_bytes: int, needed: threading.Event,
                      stop: threading.Event | None = None) -> None:
        """Return once ``need_bytes`` more fit in the budget, or at once when ``needed`` is set
        (the caller waits for what this read makes: reading now is the least that progresses)
        or ``stop`` is (the interpreter exits).
        """
        if self.used() + need_bytes + self.batches_ahead <= self.budget_bytes:
            return
        while True:
            release_unused()
            if self.used() + need_bytes + self.batches_ahead <= self.budget_bytes \
                    or needed.wait(_RECHECK_S) \
                    or (stop is not None and stop.is_set()):
                return
