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
  and freed pages go back to the system (Arrow's pool and glibc's heaps) when it has not.
  A window or batch the caller waits for is made anyway (the least memory that makes
  progress), so the budget slows a loader down and never stalls it; when that least passes
  the budget (a large batch of heavy rows, list columns padded to a batch's longest row),
  a warning says so.

The budget counts what the loader adds: the RSS growth of the process above what it was when the
iteration began (each worker process of ``to_torch`` holds its share of its own). Memory the
training step allocates meanwhile in the same process counts too: leave it room. Measured on
W1 (8M rows, 1.1 GB decoded, 2 streams): peaks of 207-219 MiB added under a 256 MiB budget;
at the smallest budget accepted (one row group per window) the peak can pass it by ~1 row group.
"""

from __future__ import annotations

import ctypes
import itertools
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
    """About the bytes a batch holds: its (dense, host) tensors', arrays' and strings',
    in dicts, lists and tuples three deep; a long list is judged by its first
    ``_SAMPLE`` items (a transform's list of 4,096 token lists made walking every value 7x
    slower than the loader). What it cannot size counts as nothing; it never raises."""
    try:
        return int(_size(batch, 3))
    except Exception:  # a user's object whose size cannot be read
        return 0


_SAMPLE = 16  # items of a long list that stand for all of it
_EXACT = 64  # a list or dict this long is summed whole (a batch's columns)


def _size(value: Any, depth: int) -> float:
    if isinstance(value, torch.Tensor):  # its own values: a view of a window is no more
        return value.numel() * value.element_size() \
            if value.is_cpu and value.layout == torch.strided else 0
    if isinstance(value, (np.ndarray, pa.Array, pa.ChunkedArray, pa.RecordBatch, pa.Table)):
        return value.nbytes
    if isinstance(value, (str, bytes)):
        return len(value) + 50  # and the object's header
    if depth == 0 or not isinstance(value, (Mapping, list, tuple)):
        return 0
    items = value.values() if isinstance(value, Mapping) else value
    n = len(items)
    if n <= _EXACT:
        return sum(_size(v, depth - 1) for v in items)
    return sum(_size(v, depth - 1) for v in itertools.islice(items, _SAMPLE)) * n / _SAMPLE


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
        self._over = 0  # the most RSS added past _OVER x the budget, not yet warned of
        self._watched = 0.0  # when watch() last looked
        self._read_at, self._last_used = 0.0, 0  # room()'s last RSS read, and what it said
        self.batches_ahead = 0  # bytes of the batches a delivery may make ahead (reads leave it)
        self._reserved = 0  # bytes of the reads admitted and not done: not all in the RSS yet
        self._admitting = threading.Lock()

    def __getstate__(self) -> dict[str, int]:
        return {"budget_bytes": self.budget_bytes}

    def __setstate__(self, state: dict[str, int]) -> None:
        self.__init__(state["budget_bytes"])  # type: ignore[misc]

    def start(self) -> None:
        """Count from now: the RSS at this moment is the baseline, once freed memory is handed
        back (the heaps kept what earlier work freed: reused, it hid what the loader added, and
        a pass over its budget went unwarned after a suite's earlier tests, found by CI)."""
        release_unused()
        self._baseline = rss_bytes()

    def used(self) -> int:
        """RSS added since :meth:`start` (0 where RSS cannot be read); the most seen past
        ``_OVER`` times the budget is kept for :meth:`warn_if_over`."""
        rss = rss_bytes()
        if rss is None or self._baseline is None:
            return 0
        used = max(0, rss - self._baseline)
        if used > max(_OVER * self.budget_bytes, self._over):
            self._over = used
        return used

    def warn_if_over(self) -> None:
        """Warn, once, if the RSS passed the budget: called in the caller's thread, where
        a warning filtered into an error reaches the user (raised in a worker thread, it
        killed the thread, and the caller never heard of it: found in review)."""
        if self._over and not self._warned:
            self._warned = True
            warnings.warn(
                f"this process held {self._over:,} bytes more than when the iteration began "
                f"({self._over / self.budget_bytes:.2f}x memory_budget_bytes="
                f"{self.budget_bytes:,}): what the loader needs to progress (a window for each "
                "worker stream, one being read, the batches being made and the one you hold, "
                "list columns padded to each batch's longest row), with what your loop "
                "allocates meanwhile, passes the budget; give a smaller batch_size, fewer "
                "num_workers, or a larger budget", RuntimeWarning, stacklevel=3)

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
        or ``stop`` is (the interpreter exits). The bytes are reserved until :meth:`release`:
        reads admitted together each saw the same room, and 8 unshuffled remote reads ahead
        held 1.5x a budget (found in review).
        """
        if self._admit(need_bytes):
            return
        while True:
            release_unused()
            if self._admit(need_bytes):
                return
            if needed.wait(_RECHECK_S) or (stop is not None and stop.is_set()):
                self._admit(need_bytes, force=True)
                return

    def _admit(self, need_bytes: int, force: bool = False) -> bool:
        with self._admitting:
            if not force and self.used() + self._reserved + need_bytes + self.batches_ahead \
                    > self.budget_bytes:
                return False
            self._reserved += need_bytes
            return True

    def release(self, need_bytes: int) -> None:
        """A read admitted by :meth:`wait_for_room` is done: its bytes are in the RSS now."""
        with self._admitting:
            self._reserved -= need_bytes
