"""Measure a loader on a dataset: rows/s, time to first batch, peak memory (``pqloader bench``)."""

from __future__ import annotations

import itertools
import resource
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from ._dataset import ParquetDataset
from ._loader import DataLoader


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
    epochs: int  # epochs the timed batches came from, the last one maybe in part
    shuffle_window_rows: int = 0  # the loader's window, as set or as chosen for the rows' size

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
          settle_s: float = 0.0, **loader_options: Any) -> BenchResult:
    """Iterate one epoch (or ``max_batches``) of ``DataLoader(dataset, **loader_options)``.

    ``max_batches`` past one epoch goes on into the next ones (``set_epoch``), as training does:
    a longer run is how to see the steady state, ``num_workers="auto"`` settled. Touches every
    batch's first tensor so nothing is skipped lazily; no training step, so this is the
    loader's own ceiling. With ``settle_s``, the loader is warmed up first, untimed: as
    many batches as are timed, or with ``num_workers="auto"`` until its tuner settles (at most
    ``settle_s`` seconds); then a fresh epoch is timed. Without it the clock starts before the
    loader is built.
    """
    reset = _reset_peak()
    start = time.perf_counter()
    loader = DataLoader(dataset, **loader_options)
    total = len(loader) if max_batches is None or not len(loader) else max_batches
    first: float | None = None
    settled = settle_s > 0
    if settled:
        first = _warm_up(loader, total, settle_s, start)
    show = sys.stderr.isatty() if progress is None else progress
    rows = batches = epochs = 0
    timed = time.perf_counter()
    with tqdm(total=total, unit="batch", disable=not show, desc="pqloader bench") as bar:
        while batches < total:
            if epochs:
                loader.set_epoch(loader.epoch + 1)
            epochs += 1
            before = batches
            for batch in loader:
                if first is None:
                    first = time.perf_counter() - start
                rows += _rows_of(batch)
                batches += 1
                bar.update(1)
                if batches >= total:
                    break
            if batches == before:  # an epoch with no batches: the next ones would loop forever
                break
    if loader.device is not None:  # copies to the device run ahead of the loop: wait for them
        torch.cuda.synchronize(loader.device)
    seconds = time.perf_counter() - (timed if settled else start)
    return BenchResult(rows, batches, seconds, first, rows / seconds if seconds else 0.0,
                       _peak_rss_mib(reset), epochs, loader._planner.window_rows)


def _warm_up(loader: DataLoader, batches: int, seconds: float, start: float) -> float | None:
    """Draw ``batches`` batches untimed, or with a tuner until it settles, for at most
    ``seconds``; set the next epoch for the timed part. Returns when the first batch came (since
    ``start``)."""
    deadline = time.perf_counter() + seconds
    first: float | None = None
    drawn = 0
    for epoch in itertools.count():
        loader.set_epoch(epoch)
        for _ in loader:
            drawn += 1
            if first is None:
                first = time.perf_counter() - start
            report = loader.autotune
            done = drawn >= batches if report is None else report.settled is not None
            if done or time.perf_counter() > deadline:
                break
        else:
            if first is not None and time.perf_counter() <= deadline:
                continue  # the epoch ended: another one
        loader.set_epoch(epoch + 1)
        break
    return first


def _rows_of(batch: Any) -> int:
    if isinstance(batch, dict) and batch:
        value = next(iter(batch.values()))
        return len(value)
    return 0


def tune(dataset: ParquetDataset, *, batch_size: int, max_batches: int = 200, repeats: int = 2,
         candidates: list[dict[str, Any]] | None = None, settle_s: float = 30.0,
         **loader_options: Any) -> list[tuple[dict[str, Any], BenchResult]]:
    """Measure ``candidates`` (loader settings) on ``dataset``, best first.

    Each candidate runs ``repeats`` times for ``max_batches`` batches, interleaved with the
    others so that the machine's noise hits them alike; its median run counts. Each loader is
    warmed up first (``bench``'s ``settle_s``), so that ``num_workers="auto"``, among the
    default candidates, is timed once its tuner has settled, and every candidate alike from a
    fresh epoch of a warm loader.
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
                                 progress=False, settle_s=settle_s, **options))
    medians = [sorted(r, key=lambda x: x.rows_per_s)[len(r) // 2] for r in runs]
    ranked = sorted(zip(candidates, medians, strict=True), key=lambda cr: -cr[1].rows_per_s)
    return ranked
