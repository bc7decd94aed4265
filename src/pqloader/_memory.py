"""``memory_budget_bytes``: the resident memory a loader may add, sized up front and held at run.

Two parts:

- **Sizing** (:func:`window_bytes`): the shuffle window, the loader's one big buffer, is cut so
  that every worker stream's windows fit in the budget together, less a reserve for the rest: a
  stream holds up to about four windows at once (the one being cut into batches, the previous
  one while batches of it wait in the prefetch queue, and the next one being read and permuted,
  which needs its Arrow table and its permuted copy), and one more is counted for slack.
- **Holding** (:class:`MemoryBudget`): the real resident set (RSS, read from ``/proc``) is
  watched: a stream reads its next window ahead only while the process has room for it, and
  Arrow's pool hands its freed pages back to the system when it has not. A stream whose caller
  waits for its next window reads it anyway (the least memory that makes progress), so the
  budget slows a loader down and never stalls it.

The budget counts what the loader adds: the RSS growth of the process above what it was when the
iteration began (each worker process of ``to_torch`` holds its share of its own). Memory the
training step allocates meanwhile in the same process counts too: leave it room. Measured on
W1 (8M rows, 1.1 GB decoded, 2 streams): peaks of 207-219 MiB added under a 256 MiB budget;
at the smallest budget accepted (one row group per window) the peak can pass it by ~1 row group.
"""

from __future__ import annotations

import os
import threading

import pyarrow as pa

WINDOWS_PER_STREAM = 5  # windows a stream may hold at once, with one for slack (see above)
RESERVE_BYTES = 48 * 2**20  # for what is not windows: threads, batches, Arrow's pool slack
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_RECHECK_S = 0.01


def rss_bytes() -> int | None:
    """This process's resident set size, or None where ``/proc`` is missing (not Linux)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


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

    def __getstate__(self) -> dict[str, int]:
        return {"budget_bytes": self.budget_bytes}

    def __setstate__(self, state: dict[str, int]) -> None:
        self.__init__(state["budget_bytes"])  # type: ignore[misc]

    def start(self) -> None:
        """Count from now: the RSS at this moment is the baseline."""
        self._baseline = rss_bytes()

    def used(self) -> int:
        """RSS added since :meth:`start` (0 where RSS cannot be read)."""
        rss = rss_bytes()
        if rss is None or self._baseline is None:
            return 0
        return max(0, rss - self._baseline)

    def wait_for_room(self, need_bytes: int, needed: threading.Event,
                      stop: threading.Event | None = None) -> None:
        """Return once ``need_bytes`` more fit in the budget, or at once when ``needed`` is set
        (the caller waits for what this read makes: reading now is the least that progresses)
        or ``stop`` is (the interpreter exits).
        """
        if self.used() + need_bytes <= self.budget_bytes:
            return
        pool = pa.default_memory_pool()
        while True:
            pool.release_unused()  # mimalloc and jemalloc keep freed pages until asked
            if self.used() + need_bytes <= self.budget_bytes or needed.wait(_RECHECK_S) \
                    or (stop is not None and stop.is_set()):
                return
