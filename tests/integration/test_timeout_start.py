"""``timeout=`` counts from when the workers are up: a worker's start (a spawned process imports
torch; a ``worker_init_fn`` connects somewhere) is no stalled batch. Starting has a limit of its
own, so a ``worker_init_fn`` that never returns is still an error, not a hang."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import pqloader
import pqloader._deliver
import pqloader._processes

ROWS = 200


class _SlowInit:
    """A ``worker_init_fn`` that takes ``seconds`` (picklable, for spawned workers)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, worker_id: int) -> None:
        time.sleep(self.seconds)


def _ids(loader: Any) -> list[int]:
    return sorted(int(i) for b in loader for i in b["id"])


@pytest.mark.parametrize("mode", [
    pytest.param({}, id="threads"),
    pytest.param({"worker_type": "process"}, id="fork"),
    pytest.param({"worker_type": "process", "multiprocessing_context": "spawn"}, id="spawn"),
])
def test_a_slow_start_is_no_timeout(make_dataset: Any, mode: dict[str, Any]) -> None:
    ds = pqloader.ParquetDataset(make_dataset(ROWS), columns=["id"])
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=2, timeout=0.5,
                                 worker_init_fn=_SlowInit(1.5), **mode)
    assert _ids(loader) == list(range(ROWS))  # was LoaderTimeoutError: the start was counted


def test_processes_that_never_start_are_an_error(make_dataset: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pqloader._processes, "START_GRACE_S", 1.0)
    ds = pqloader.ParquetDataset(make_dataset(ROWS), columns=["id"])
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=2, worker_type="process",
                                 timeout=0.5, worker_init_fn=_SlowInit(600))
    began = time.monotonic()
    with pytest.raises(pqloader.LoaderTimeoutError, match=r"had not started within 1\.5 s"):
        list(loader)
    assert time.monotonic() - began < 10  # the stuck processes were stopped, not joined


def test_threads_that_never_start_are_an_error(make_dataset: Any,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pqloader._deliver, "START_GRACE_S", 1.0)
    release = threading.Event()
    ds = pqloader.ParquetDataset(make_dataset(ROWS), columns=["id"])
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=2, timeout=0.5,
                                 worker_init_fn=lambda i: release.wait(60))
    try:
        with pytest.raises(pqloader.LoaderTimeoutError,
                           match=r"worker_init_fn had not returned .* within 1\.5 s"):
            list(loader)
    finally:
        release.set()
