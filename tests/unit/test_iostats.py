"""IOStats: counts shared with worker processes however they start, none lost when two
processes add at once."""

from __future__ import annotations

import multiprocessing
import pickle
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch.utils.data

from pqloader._iostats import IOStats

ADDS = 100_000


class _Counting(torch.utils.data.IterableDataset[int]):
    """A worker's whole life: once every worker has started, count ``ADDS`` requests on the
    dataset's stats, then yield once."""

    def __init__(self, stats: IOStats, start: Any) -> None:
        self.stats = stats
        self.start = start

    def __iter__(self) -> Iterator[int]:
        self.start.wait(60)
        for _ in range(ADDS):
            self.stats.add(requests=1, bytes=2)
        yield 1


def test_two_loaders_workers_0_lose_no_count() -> None:
    """Two torch loaders over one dataset, each with a worker 0, adding at the same time (the
    rows per worker id they used to share lost counts), and the parent adding too."""
    stats = IOStats()
    start = multiprocessing.get_context("spawn").Barrier(4)
    loaders = [torch.utils.data.DataLoader(_Counting(stats, start), batch_size=None,
                                           num_workers=1, multiprocessing_context=ctx)
               for ctx in ("spawn", "fork", "spawn")]
    running = [iter(loader) for loader in loaders]  # each worker starts on its first batch
    start.wait(60)
    for _ in range(ADDS):
        stats.add(requests=1)
    assert [next(it) for it in running] == [1, 1, 1]
    for it in running:
        assert next(it, None) is None
    counts = stats.as_dict()
    assert counts["requests"] == 4 * ADDS
    assert counts["bytes"] == 6 * ADDS


def _count_forever(stats: IOStats) -> None:
    while True:
        stats.add(requests=1)


def _count_once(stats: IOStats) -> None:
    stats.add(retries=1)


def test_a_worker_killed_while_counting_blocks_no_one() -> None:
    """A stuck worker stopped, or one the OOM killer took, while it counted: the others go on
    (with one lock shared by every count, the next count or ``io_stats()`` hung forever)."""
    stats = IOStats()
    fork = multiprocessing.get_context("fork")

    def kill_counting_workers() -> None:
        for _ in range(20):
            busy = fork.Process(target=_count_forever, args=(stats,))
            busy.start()
            while stats.as_dict()["requests"] == 0:
                time.sleep(0.001)
            time.sleep(0.01)
            busy.kill()
            busy.join()
        late = fork.Process(target=_count_once, args=(stats,))
        late.start()
        late.join(30)
        assert late.exitcode == 0
        stats.add(retries=1)

    done = threading.Thread(target=kill_counting_workers, daemon=True)
    done.start()
    done.join(120)
    assert not done.is_alive(), "a count or io_stats() hung after a worker was killed"
    assert stats.as_dict()["retries"] == 2


def test_a_pickled_copy_counts_on_its_own() -> None:
    stats = IOStats()
    stats.add(retries=3)
    copy = pickle.loads(pickle.dumps(stats))
    copy.add(retries=1)
    assert stats.as_dict()["retries"] == 3
    assert copy.as_dict()["retries"] == 1
