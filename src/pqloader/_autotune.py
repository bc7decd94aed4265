"""Online tuning of the number of worker threads, from the measured delivery rate.

``num_workers="auto"`` plans the epoch for one stream (the order of ``num_workers=0``), read
``S`` windows ahead (one per core, at most 8), and lets this tuner choose, while batches flow,
how many threads make its batches: from ``S`` down to none (the caller makes batches itself).
The order of batches never depends on the choice (see ``_shared.SharedStream``), so tuning
changes speed only.

The rate is noisy on a shared machine: one count's rate swung 2-3x between seconds here, more
than the counts differ from each other. So no single interval decides. Counts are compared in
turns (``a b c c b a a b c c b a``: ``passes`` intervals each, the direction alternating, so a
slow spell or a steady drift of the machine weighs on every count alike) and ranked by their
median rate. A count far behind the best is not measured again, so little time goes to bad
settings: under 60% of the best after the first turn, or with a median under 70% of the best
median after any later turn (medians of 2+ interleaved samples are rarely that far apart by the
machine's swings alone). W3's 0 threads, at 0.65x of 2, now costs 2 turns instead of 4, and
the first comparison settles in ~4 s instead of ~6 (measured). The winner is the fewest threads
within ``tolerance`` of the best median: fewer threads leave cores to the training step and
hold less memory. The tuner's first interval is not counted: every stream then reads its first
window at once into freshly faulted memory, and whichever count is measured then looks slow.

The first comparison takes every count from ``S`` to 0 (``S`` is small: at most 8). Later ones
take the settled count and its neighbours; when a neighbour wins, its own neighbours are
compared next, until the winner is the centre of its comparison. In a check of the settled
count, it keeps its place while within tolerance of the best (hysteresis: a noisy check alone
does not move it).

Every ``hold_intervals`` intervals it checks the settled count against its neighbours again,
since the best count moves when the training step's own load does. The tuner lives on the
loader, so a later epoch starts from what an earlier one found.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field


@dataclass
class TunerReport:
    """What the tuner tried: ``rates`` maps thread counts to their last measured batches/s
    (the median of the last comparison that measured them)."""

    threads: int  # now (during a comparison, the count being measured)
    rates: dict[int, float] = field(default_factory=dict)
    changes: int = 0
    settled: int | None = None  # the winner of the last comparison (None: still comparing)


class ThreadTuner:
    """Chooses a thread count in ``min_threads .. max_threads`` from batches/s measured by the
    caller.

    Call :meth:`observe` once per delivered batch; when it returns a number, set that many
    threads. Each interval lasts at least ``interval_s`` seconds and ``min_batches`` batches,
    and starts once ``settle_batches`` batches made under the previous count have drained.
    """

    def __init__(self, max_threads: int, *, interval_s: float = 0.5, min_batches: int = 8,
                 settle_batches: int = 4, tolerance: float = 0.05, passes: int = 4,
                 drop_below: float = 0.6, drop_later: float = 0.7,
                 hold_intervals: int = 40, min_threads: int = 0) -> None:
        self.max_threads = max(0, max_threads)
        self.min_threads = min(max(0, min_threads), self.max_threads)
        self.interval_s = interval_s
        self.min_batches = max(1, min_batches)
        self.settle_batches = max(0, settle_batches)
        self.tolerance = tolerance
        self.passes = max(1, passes)
        self.drop_below = drop_below
        self.drop_later = drop_later
        self.hold_intervals = max(1, hold_intervals)
        self.report = TunerReport(threads=self.max_threads)
        self._samples: dict[int, list[float]] = {}  # this comparison's rates per count
        self._turns: list[int] = []  # counts still to measure in this comparison
        self._alive: set[int] = set()  # counts this comparison still measures
        self._pruned_after = 0  # turns after which it last dropped the slow counts
        self._centre: int | None = None  # the count a comparison of neighbours is centred on
        self._incumbent: int | None = None  # the settled count this comparison checks
        self._compare(list(range(self.max_threads, self.min_threads - 1, -1)))  # every count
        self._held = 0  # intervals at the settled count since the last comparison
        self._settling = self.settle_batches
        self._t0 = 0.0
        self._batches = 0
        self._last = 0.0  # when the last batch was observed (or an epoch began)
        self._began: float | None = None  # when the current epoch began
        self._epoch_batches = self._last_epoch_batches = 0  # this epoch's, the last one's
        self._carried: tuple[float, int] | None = None  # an interval paused at an epoch start
        # the first full interval is the process's cold start (first windows read at once into
        # freshly faulted memory, first calls): not counted. It made the count measured first,
        # 2 threads, look ~2x slower on W3 (measured), and it was dropped.
        self._warming = True

    @property
    def threads(self) -> int:
        return self.report.threads

    def restart_interval(self, now: float | None = None) -> None:
        """A new epoch begins.

        After an epoch at least an interval long, the new epoch's first batches (its first
        window read) are not counted: which interval holds an epoch's start depends on phase,
        and counted, it made one count's sample slow and not another's (a review's simulation
        of W1-like epochs: the right count 179 times in 271, against 271). The interval under
        way is paused meanwhile, and goes on after them: forgotten at each epoch, no interval
        ended in epochs shorter than the settling and an interval together (10-20 batches: the
        tuner never settled, found in review). Those first batches are at most half the last
        epoch's. After a shorter epoch, the interval carries on, the epoch's start counted:
        such epochs are mostly their start (a 50 ms epoch of one window made the rest drain a
        full queue at 20,000+ batches/s), and restarting each one, no interval ever ended.
        The caller's time between epochs never counts.
        """
        now = time.perf_counter() if now is None else now
        short = self._began is not None and self._last - self._began < self.interval_s
        if self._epoch_batches:
            self._last_epoch_batches, self._epoch_batches = self._epoch_batches, 0
        if not short:
            if self._t0 and not self._settling:  # an interval under way: paused
                self._carried = (self._last - self._t0, self._batches)
            start = min(self.settle_batches, max(1, self._last_epoch_batches // 2))
            self._settling = max(self._settling, start)
            self._t0, self._batches = 0.0, 0  # the next counted batch starts the interval
        elif self._settling:
            self._settling, self._carried = 0, None
            self._t0, self._batches = 0.0, 0
        elif self._t0:
            self._t0 += now - self._last
        self._began = self._last = now

    def observe(self, now: float | None = None) -> int | None:
        """One more batch delivered; a new thread count to set, or None."""
        now = time.perf_counter() if now is None else now
        self._last = now
        self._epoch_batches += 1
        if self._settling:
            self._settling -= 1
            if not self._settling:
                elapsed, self._batches = self._carried or (0.0, 0)
                self._t0, self._carried = now - elapsed, None
            return None
        if self._batches == 0 and self._t0 == 0.0:
            self._t0 = now
        self._batches += 1
        elapsed = now - self._t0
        if elapsed < self.interval_s or self._batches < self.min_batches:
            return None
        rate = self._batches / max(elapsed, 1e-9)
        self._t0, self._batches = now, 0
        if self._warming:
            self._warming = False
            return None
        return self._measured(rate)

    # -- the search -------------------------------------------------------------------------
    def _measured(self, rate: float) -> int | None:
        current = self.report.threads
        if not self._samples:  # holding the settled count
            self._held += 1
            if self._held < self.hold_intervals:
                return None
            return self._neighbours(current, incumbent=current)
        self._samples[current].append(rate)
        self._drop_far_behind()
        if self._turns and len(self._alive) > 1:
            return self._switch(self._turns.pop(0))
        return self._settle()

    def _compare(self, counts: list[int], centre: int | None = None,
                 incumbent: int | None = None) -> int | None:
        """Start a comparison of ``counts``, measured in turns from the current count. An
        ``incumbent`` (the settled count, checked again) keeps its place while within
        tolerance of the best: a noisy check alone does not move it."""
        self._held = 0
        self._centre, self._incumbent = centre, incumbent
        if len(counts) == 1:  # nothing to compare (max_threads 0)
            self.report.settled = counts[0]
            return self._switch(counts[0])
        self._samples = {t: [] for t in counts}
        self._alive, self._pruned_after = set(counts), 0
        current = self.report.threads
        order = [current] + [t for t in counts if t != current] if current in counts else counts
        # alternate directions (a b c c b a a b c): a steady drift of the machine's speed
        # then weighs on every count alike
        turns = [t for p in range(self.passes) for t in (order if p % 2 == 0 else order[::-1])]
        self._turns = turns[1:]
        return self._switch(turns[0])

    def _neighbours(self, centre: int, incumbent: int | None = None) -> int | None:
        counts = [t for t in (centre, centre - 1, centre + 1)
                  if self.min_threads <= t <= self.max_threads]
        return self._compare(counts, centre, incumbent)

    def _drop_far_behind(self) -> None:
        """Once every count still measured has one more sample, stop measuring those far
        slower than the best: on the first samples, under ``drop_below`` of the best; later,
        a median under ``drop_later`` of the best median."""
        turns = min(len(self._samples[t]) for t in self._alive)
        if turns <= self._pruned_after:
            return
        self._pruned_after = turns
        limit = self.drop_below if turns == 1 else self.drop_later
        rates = {t: statistics.median(self._samples[t]) for t in self._alive}
        best = max(rates.values())
        self._alive -= {t for t, r in rates.items() if r < limit * best}
        self._turns = [t for t in self._turns if t in self._alive]

    def _settle(self) -> int | None:
        """End the comparison on the fewest threads within tolerance of the best median."""
        medians = {t: statistics.median(s) for t, s in self._samples.items() if s}
        self.report.rates.update(medians)
        fast = {t: r for t, r in medians.items() if t in self._alive}
        self._samples, self._turns = {}, []
        choice = self._fewest_within(fast)
        kept = self._incumbent
        if kept is not None and kept in fast and fast[kept] >= (1 - self.tolerance) * max(
                fast.values()):
            choice = kept
        if self._centre is not None and choice != self._centre:
            return self._neighbours(choice)  # the best lies at an edge: compare around it
        self.report.settled = choice
        return self._switch(choice)

    def _fewest_within(self, rates: dict[int, float]) -> int:
        best = max(rates.values())
        return min(t for t, r in rates.items() if r >= (1 - self.tolerance) * best)

    def _switch(self, threads: int) -> int | None:
        self._settling = self.settle_batches
        if threads == self.report.threads:
            return None
        self.report.threads = threads
        self.report.changes += 1
        return threads
