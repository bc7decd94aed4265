"""Online tuning of the number of worker threads, from the measured delivery rate.

``num_workers="auto"`` plans the epoch for ``S`` worker streams (one per core, at most 8) and
lets this tuner choose, while batches flow, how many threads advance them: from ``S`` down to
none (the caller makes batches itself). The order of batches never depends on the choice (see
``_deliver``), so tuning changes speed only.

The search is a descent with a tolerance: measure the rate at ``S`` threads, then one fewer, and
so on while the rate stays within ``tolerance`` of the best seen; settle on the fewest threads
within it (fewer threads leave cores to the training step and hold less memory). Every
``hold_intervals`` intervals it measures the settled count and its neighbours again, since the
best count moves when the training step's own load does. The tuner lives on the loader, so a
later epoch starts from what an earlier one found.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class TunerReport:
    """What the tuner tried: ``rates`` maps thread counts to their last measured batches/s."""

    threads: int
    rates: dict[int, float] = field(default_factory=dict)
    changes: int = 0


class ThreadTuner:
    """Chooses a thread count in ``0 .. max_threads`` from batches/s measured by the caller.

    Call :meth:`observe` once per delivered batch; when it returns a number, set that many
    threads. Each count is measured over at least ``interval_s`` seconds and ``min_batches``
    batches, after ``settle_batches`` batches made under the previous count have drained.
    """

    def __init__(self, max_threads: int, *, interval_s: float = 0.5, min_batches: int = 8,
                 settle_batches: int = 4, tolerance: float = 0.05,
                 hold_intervals: int = 20) -> None:
        self.max_threads = max(0, max_threads)
        self.interval_s = interval_s
        self.min_batches = max(1, min_batches)
        self.settle_batches = max(0, settle_batches)
        self.tolerance = tolerance
        self.hold_intervals = max(1, hold_intervals)
        self.report = TunerReport(threads=self.max_threads)
        self._queue: list[int] = []  # counts still to measure in this round
        self._round: dict[int, float] = {}  # this round's measurements
        self._held = 0  # intervals spent at the settled count since the last round
        self._settling = self.settle_batches
        self._t0 = 0.0
        self._batches = 0
        self._descending = True  # the first round walks down from max_threads

    @property
    def threads(self) -> int:
        return self.report.threads

    def restart_interval(self) -> None:
        """Forget a partly measured interval (a new epoch: its first window is a cold start)."""
        self._settling = self.settle_batches
        self._t0, self._batches = 0.0, 0

    def observe(self, now: float | None = None) -> int | None:
        """One more batch delivered; a new thread count to set, or None."""
        now = time.perf_counter() if now is None else now
        if self._settling:
            self._settling -= 1
            if not self._settling:
                self._t0, self._batches = now, 0
            return None
        if self._batches == 0 and self._t0 == 0.0:
            self._t0 = now
        self._batches += 1
        elapsed = now - self._t0
        if elapsed < self.interval_s or self._batches < self.min_batches:
            return None
        rate = self._batches / max(elapsed, 1e-9)
        self._t0, self._batches = now, 0
        return self._measured(rate)

    # -- the search -------------------------------------------------------------------------
    def _measured(self, rate: float) -> int | None:
        current = self.report.threads
        self.report.rates[current] = rate
        if not self._round and not self._queue and not self._descending:
            self._held += 1  # holding the settled count
            if self._held < self.hold_intervals:
                return None
            self._held = 0
            self._queue = [t for t in (current - 1, current + 1) if 0 <= t <= self.max_threads]
        self._round[current] = rate
        if self._descending:
            best = max(self._round.values())
            if rate >= (1 - self.tolerance) * best and current > 0:
                return self._switch(current - 1)
            self._descending = False
            return self._settle()
        if self._queue:
            return self._switch(self._queue.pop(0))
        return self._settle()

    def _settle(self) -> int | None:
        """End the round on the fewest threads within tolerance of its best rate."""
        best = max(self._round.values())
        choice = min(t for t, r in self._round.items() if r >= (1 - self.tolerance) * best)
        self._round = {}
        return self._switch(choice)

    def _switch(self, threads: int) -> int | None:
        self._settling = self.settle_batches
        if threads == self.report.threads:
            return None
        self.report.threads = threads
        self.report.changes += 1
        return threads
