"""Measure a loader on a dataset: rows/s, time to first batch, peak memory (``pqloader bench``)."""

from __future__ import annotations

import gc
import itertools
import resource
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from ._dataset import ParquetDataset
from ._loader import DataLoader
from ._memory import release_unused


@dataclass(frozen=True)
class BenchResult:
    rows: int
    batches: int
    seconds: float
    first_batch_s: float | None  # from building the loader to its first batch (None: none)
    rows_per_s: float
    # This process's peak RSS during this run (its whole life's where Linux cannot reset the
    # peak), plus the largest peak of its finished children (worker processes): an estimate,
    # not the peak of the whole tree at one moment.
    peak_rss_mib: float
    epochs: int  # epochs the timed batches came from, the first and last maybe in part
    shuffle_window_rows: int = 0  # the loader's window, as set or as chosen for the rows' size
    # num_workers="auto": the threads it ran at the end, and the count it settled on (None:
    # still comparing; a run timed then measured several counts)
    auto_threads: int | None = None
    auto_settled: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _reset_peak() -> bool:
    """Reset this process's peak RSS (Linux 4.0+): each of ``tune``'s runs reported the peak
    of every run before it, ru_maxrss only growing (found in review)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_mib(since_reset: bool) -> float:
    # ru_maxrss is KiB on Linux; for RUSAGE_CHILDREN it is the largest finished child's peak
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if since_reset:
        try:
            with open("/proc/self/status", encoding="ascii") as f:
                own = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        except (OSError, StopIteration, ValueError, IndexError):
            pass
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return float(own + children) / 1024


def bench(dataset: ParquetDataset, *, max_batches: int | None = None, progress: bool | None = None,
          settle_s: float = 0.0, min_seconds: float = 0.0, **loader_options: Any
          ) -> BenchResult:
    """Iterate one epoch (or ``max_batches``) of ``DataLoader(dataset, **loader_options)``.

    ``max_batches`` past one epoch goes on into the next ones (``set_epoch``), as training does:
    a longer run is how to see the steady state, ``num_workers="auto"`` settled. Touches every
    batch's first tensor so nothing is skipped lazily; no training step, so this is the
    loader's own ceiling. With ``settle_s``, the loader is warmed up first, untimed: as
    many batches as are timed, or with ``num_workers="auto"`` until its tuner settles (at most
    ``settle_s`` seconds); the timed batches follow on in the same pass, so that an epoch's
    start (its first window read) weighs on them as it does in training, where it is one of
    the epoch's batches (a fresh epoch's 200 small batches were mostly its first window's read:
    ``tune`` ranked the fastest setting 9th at batch 64, found in review). Without it the
    clock starts before the loader is built. With ``min_seconds``, batches go on past
    ``max_batches`` until that long is timed: short runs time the batches cut from a window
    already read more than the reads (200 batches of 64 rows are 5 ms, a few percent of one
    window), long ones the mix training sees.
    """
    gc.collect()  # what an earlier run in this process left, given back: not in this peak
    release_unused()
    reset = _reset_peak()
    start = time.perf_counter()
    loader = DataLoader(dataset, **loader_options)
    total = len(loader) if max_batches is None or not len(loader) else max_batches
    first: float | None = None
    settled = settle_s > 0
    going: Iterator[Any] | None = None  # the warm-up's pass, where the timed batches go on
    if settled:
        first, going = _warm_up(loader, total, settle_s, start)
    show = sys.stderr.isatty() if progress is None else progress
    rows = batches = epochs = 0
    timed = time.perf_counter()
    with tqdm(total=total, unit="batch", disable=not show, desc="pqloader bench") as bar:
        while batches < total or time.perf_counter() - timed < min_seconds:
            fresh = going is None
            if going is None:
                if epochs or settled:
                    loader.set_epoch(loader.epoch + 1)
                going = iter(loader)
            before = batches
            for batch in going:
                if batches == before:  # an epoch a timed batch came from (not the warm-up's
                    epochs += 1  # pass when it ended with its last batch)
                if first is None:
                    first = time.perf_counter() - start
                rows += _rows_of(batch)
                batches += 1
                bar.update(1)
                if batches >= total and time.perf_counter() - timed >= min_seconds:
                    break
            else:
                going = None
            if fresh and batches == before:  # an epoch with no batches: the next ones would
                break  # loop forever
    if loader.device is not None:  # copies to the device run ahead of the loop: wait for them
        torch.cuda.synchronize(loader.device)
    seconds = time.perf_counter() - (timed if settled else start)
    # Worker processes end (and are waited for) before the peak is read: the children's
    # peak counts finished ones only, and read while they ran, 0 (found by a CLI fuzzer:
    # 387 MiB reported where the process tree had peaked at 796)
    if going is not None and hasattr(going, "close"):  # (a Pass, or the warm-up's generator)
        going.close()
    loader._processes.forget()  # persistent ones too
    gc.collect()
    report = loader.autotune
    return BenchResult(rows, batches, seconds, first, rows / seconds if seconds else 0.0,
                       _peak_rss_mib(reset), epochs, loader._planner.window_rows,
                       None if report is None else report.threads,
                       None if report is None else report.settled)


def _warm_up(loader: DataLoader, batches: int, seconds: float, start: float
             ) -> tuple[float | None, Iterator[Any] | None]:
    """Draw ``batches`` batches untimed, or with a tuner until it settles, for at most
    ``seconds``. Returns when the first batch came (since ``start``), and the pass it stopped
    in (None: it stopped at an epoch's end)."""
    deadline = time.perf_counter() + seconds
    first: float | None = None
    drawn = 0
    for epoch in itertools.count():
        loader.set_epoch(epoch)
        going = iter(loader)
        for _ in going:
            drawn += 1
            if first is None:
                first = time.perf_counter() - start
            report = loader.autotune
            done = drawn >= batches if report is None else report.settled is not None
            if done or time.perf_counter() > deadline:
                return first, going
        if first is None or time.perf_counter() > deadline:
            return first, None  # (no batch at all: an empty epoch)
    raise AssertionError("unreachable")


def _rows_of(batch: Any) -> int:
    if isinstance(batch, dict) and batch:
        value = next(iter(batch.values()))
        return len(value)
    return 0


def tune(dataset: ParquetDataset, *, batch_size: int, max_batches: int = 200, repeats: int = 2,
         candidates: list[dict[str, Any]] | None = None, settle_s: float = 30.0,
         trial_s: float = 2.0, **loader_options: Any
         ) -> list[tuple[dict[str, Any], BenchResult]]:
    """Measure ``candidates`` (loader settings) on ``dataset``, best first.

    Each candidate runs ``repeats`` times for ``max_batches`` batches and at least ``trial_s``
    seconds (``bench``'s ``min_seconds``: windows read and cut alike), interleaved with the
    others so that the machine's noise hits them alike; its median run counts. Each loader is
    warmed up first (``bench``'s ``settle_s``), so that ``num_workers="auto"``, among the
    default candidates, is timed once its tuner has settled, and every candidate alike from
    where its warm-up stopped.
    """
    if candidates is None:  # (0 workers: no prefetch, the caller makes each batch)
        candidates = [{"num_workers": 0}, *({"num_workers": n, "prefetch_factor": p}
                                            for n in (1, 2, 3, 4) for p in (2, 8))]
        candidates.append({"num_workers": "auto"})
    runs: list[list[BenchResult]] = [[] for _ in candidates]
    for _ in range(repeats):
        for i, settings in enumerate(candidates):
            options = {**loader_options, **settings}
            if not options.get("num_workers"):
                options.pop("prefetch_factor", None)
            runs[i].append(bench(dataset, batch_size=batch_size, max_batches=max_batches,
                                 progress=False, settle_s=settle_s, min_seconds=trial_s,
                                 **options))
    medians = [sorted(r, key=lambda x: x.rows_per_s)[len(r) // 2] for r in runs]
    ranked = sorted(zip(candidates, medians, strict=True), key=lambda cr: -cr[1].rows_per_s)
    return ranked
