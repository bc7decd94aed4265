"""Faults met at the edges of a run: the interpreter exiting with an iterator open, a read
that never returns, a worker_init_fn that fails while no one waits, a file changed after its
manifest opened it. Each ends promptly, with the error named; none hangs or aborts."""

from __future__ import annotations

import collections
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import pqloader

_PRELUDE = """
import sys, time
import numpy as np, pyarrow as pa, torch
import pqloader
pqloader.write_dataset(pa.table({"x": np.arange(4000), "y": np.random.rand(4000)}),
                       sys.argv[1], rows_per_file=1000, row_group_size=100)
ds = pqloader.ParquetDataset(sys.argv[1])
"""


def _run(tmp_path: Path, body: str, *args: str, limit_s: float = 90) -> tuple[int, str, float]:
    script = tmp_path / "script.py"
    script.write_text(_PRELUDE + textwrap.dedent(body))
    began = time.monotonic()
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "ds"), *args],
                          capture_output=True, text=True, timeout=limit_s)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - began


@pytest.mark.parametrize("num_workers", ["2", "auto"])
def test_exiting_with_an_iterator_open_and_threads_in_torch_is_clean(
        tmp_path: Path, num_workers: str) -> None:
    # A daemon thread inside a torch op at finalization aborted the process (status 134).
    code, out, _ = _run(tmp_path, """
        def heavy(batch):
            a = torch.randn(256, 256)
            for _ in range(20):
                a = a @ a
                a = a / a.norm()
            batch["y"] = batch["y"] * a[0, 0]
            return batch
        n = sys.argv[2]
        loader = pqloader.DataLoader(ds, batch_size=8, shuffle=True, transform=heavy,
                                     num_workers=n if n == "auto" else int(n))
        data_iter = iter(loader)
        for _ in range(3):
            next(data_iter)
        sys.exit(0)
        """, num_workers)
    assert code == 0, out


def test_exiting_while_a_slow_transform_makes_a_batch_waits_for_it(tmp_path: Path) -> None:
    """A transform of torch ops taking longer than the exit's wait (5 s; 0.5 here) was ended
    mid-call at finalization: the finished script aborted, status 134 (found in review)."""
    code, out, _ = _run(tmp_path, """
        from pqloader import _threads
        _threads.EXIT_WAIT_S = 0.5
        torch.set_num_threads(1)
        def heavy(batch):  # CPU augmentation of a large batch: seconds of GIL-free torch
            a, began = torch.randn(200, 200), time.monotonic()
            while time.monotonic() - began < 2.0:
                a = torch.tanh(a @ a)
            return batch
        loader = pqloader.DataLoader(ds, batch_size=512, num_workers=2, transform=heavy)
        for batch in loader:
            break
        print("done", flush=True)
        """)
    assert code == 0 and "done" in out, out
    assert "at exit, waiting up to" in out and "to finish their batch" in out, out


@pytest.mark.parametrize("num_workers", ["0", "2", "auto"])
def test_a_read_that_never_returns_times_out_and_the_process_exits(
        tmp_path: Path, num_workers: str) -> None:
    code, out, seconds = _run(tmp_path, """
        import threading
        from pqloader import _read
        hung, read = threading.Event(), _read.FragmentReader.read
        def stuck(self, fragment):
            if fragment == 7:
                hung.wait()  # a file system that never answers
            return read(self, fragment)
        _read.FragmentReader.read = stuck
        n = sys.argv[2]
        loader = pqloader.DataLoader(ds, batch_size=16, shuffle_window_rows=100, timeout=1.0,
                                     num_workers=n if n == "auto" else int(n))
        try:
            for _ in loader:
                pass
        except pqloader.LoaderTimeoutError as exc:
            print("timed out:", exc)
        """, num_workers)
    assert code == 0 and "timed out:" in out, out
    assert seconds < 60  # the exit waits for stuck threads a bounded time only


def test_exiting_while_a_read_ahead_waits_for_memory_room_is_prompt(tmp_path: Path) -> None:
    code, out, seconds = _run(tmp_path, """
        loader = pqloader.DataLoader(ds, batch_size=16, num_workers="auto", shuffle=True,
                                     shuffle_window_rows=200, memory_budget_bytes=64 * 2**20)
        it = iter(loader)  # a global: alive until the interpreter's very end
        next(it)
        held = np.ones(200 * 2**20, dtype=np.uint8)  # the training step's memory: no room
        for _ in range(15):
            next(it)
        print("leaving mid-epoch")
        """)
    assert code == 0 and "leaving mid-epoch" in out, out
    assert seconds < 30  # not the exit's bounded wait for busy threads, nor forever


def test_a_worker_init_fn_error_is_raised_even_if_no_one_was_waiting(
        make_dataset: Any) -> None:
    def init(index: int) -> None:
        if index == 1:
            time.sleep(0.3)  # the other thread makes every batch meanwhile
            raise RuntimeError("could not open the label store")

    ds = pqloader.ParquetDataset(make_dataset(1000))
    loader = pqloader.DataLoader(ds, batch_size=8, num_workers=2, worker_init_fn=init,
                                 transform=lambda b: (time.sleep(0.005), b)[1])
    for _ in range(2):
        with pytest.raises(RuntimeError, match="label store"):
            list(loader)


def test_a_footer_damaged_after_a_manifest_open_is_named(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    pqloader.write_dataset(pa.table({"x": list(range(100))}), root, rows_per_file=50)
    ds = pqloader.ParquetDataset(root)  # from the manifest: no footer read yet
    shard = sorted(root.glob("part-*.parquet"))[1]
    footer = pq.read_metadata(shard).serialized_size
    data = bytearray(shard.read_bytes())
    start = len(data) - 8 - footer
    data[start:start + 32] = b"\xff" * 32  # the footer's head; its length and magic stay
    shard.write_bytes(bytes(data))
    with pytest.raises(pqloader.CorruptFileError, match=rf"{shard.name}: row group 0"):
        list(pqloader.DataLoader(ds, batch_size=10, num_workers=0))


def _unpicklable(batch: dict[str, Any]) -> dict[str, Any]:
    batch["scale"] = lambda v: v * 2  # fine in threads; cannot cross to another process
    return batch


class _Linear(torch.nn.Module):
    """A transform with parameters: its output requires grad and is no leaf."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(1))

    def forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {"x": batch["x"] * self.scale}


def _meta_first(batch: dict[str, Any]) -> Any:
    return "meta", batch["id"], threading.Lock()


def _ordered(batch: dict[str, Any]) -> Any:
    return collections.OrderedDict(id=batch["id"], lock=threading.Lock())


@pytest.mark.parametrize(("transform", "said"), [
    (_Linear(), "requires grad and is not a leaf"),
    (lambda b: {**b, "y": _Linear()(b)["x"]}, "the batch's 'y' cannot be sent"),
    (lambda b: _Linear()(b)["x"], "requires grad and is not a leaf"),
    (lambda b: (b["id"], _Linear()(b)["x"]), "requires grad and is not a leaf"),
    (_meta_first, r"the batch \(its 2\) cannot be sent"),
    (_ordered, r"the batch \(its 'lock'\) cannot be sent"),
])
def test_any_batch_that_cannot_leave_a_worker_process_is_an_error_not_a_hang(
        make_dataset: Any, transform: Any, said: str) -> None:
    """torch's process queue refused these in its own thread, printed why and dropped the
    batch: the caller waited forever (found in review: a module with parameters as the
    transform, outside torch.no_grad(); a lock beside a tensor in a tuple or OrderedDict)."""
    ds = pqloader.ParquetDataset(make_dataset(100))
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=1, worker_type="process",
                                 multiprocessing_context="fork", transform=transform,
                                 timeout=60)
    began = time.monotonic()
    with pytest.raises(TypeError, match=said):
        list(loader)
    assert time.monotonic() - began < 30


def test_a_batch_that_cannot_leave_a_worker_process_is_an_error_not_a_hang(
        make_dataset: Any) -> None:
    ds = pqloader.ParquetDataset(make_dataset(1000))
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=2, worker_type="process",
                                 transform=_unpicklable)
    began = time.monotonic()
    with pytest.raises(TypeError, match="'scale' cannot be sent from a worker process"):
        list(loader)
    assert time.monotonic() - began < 30


def _fails_at_500(batch: dict[str, Any]) -> dict[str, Any]:
    if 500 in batch["id"].tolist():
        raise ValueError("bad row")
    return batch


@pytest.mark.parametrize("kind", ["thread", "process", "auto"])
def test_a_loader_whose_transform_failed_is_freed_once_dropped(make_dataset: Any,
                                                               kind: str) -> None:
    """The error's traceback held frames that held the error: a cycle through the loader, so
    it (and its persistent worker processes) lived on until a garbage collection, whose
    forked workers then printed torch's "can only test a child process" (found in review)."""
    import gc
    import weakref

    ds = pqloader.ParquetDataset(make_dataset(1000))
    options: dict[str, Any] = {"num_workers": "auto"} if kind == "auto" else {
        "num_workers": 2, "worker_type": kind, "persistent_workers": kind == "process"}
    loader = pqloader.DataLoader(ds, batch_size=64, transform=_fails_at_500, **options)
    gc.collect()
    gc.disable()  # freed by reference counts alone, as torch's own loader is
    try:
        with pytest.raises(ValueError, match="bad row"):
            list(loader)
        ref = weakref.ref(loader)
        del loader
        assert ref() is None
    finally:
        gc.enable()


def test_persistent_worker_processes_start_anew_after_one_is_killed(make_dataset: Any) -> None:
    import os
    import signal

    import psutil

    ds = pqloader.ParquetDataset(make_dataset(1000))
    loader = pqloader.DataLoader(ds, batch_size=10, num_workers=2, worker_type="process",
                                 persistent_workers=True,
                                 transform=lambda b: (time.sleep(0.01), b)[1])
    try:
        before = {p.pid for p in psutil.Process().children()}  # servers of other tests too
        it = iter(loader)
        next(it)
        workers = [p for p in psutil.Process().children() if p.pid not in before
                   and "resource_tracker" not in " ".join(p.cmdline())]
        assert len(workers) == 2
        with pytest.raises(RuntimeError, match=r"exited unexpectedly|killed"):
            os.kill(workers[0].pid, signal.SIGKILL)  # the OOM killer, say (inside: torch's
            for _ in it:  # SIGCHLD handler may raise at once)
                pass
        del it
        for epoch in (1, 2):  # not "worker exited unexpectedly" at once, every epoch
            loader.set_epoch(epoch)
            assert sorted(int(i) for b in loader for i in b["id"]) == list(range(1000))
    finally:
        del loader


def test_a_batch_whose_worker_died_before_it_was_received_names_the_worker() -> None:
    """A batch's tensors cross as file descriptors fetched from its worker: one killed between
    sending and the fetch surfaced as multiprocessing's bare EOFError (under Python 3.13, in
    the test above); it is told as torch tells a worker that died."""
    import multiprocessing
    import os
    import re
    import signal
    from types import SimpleNamespace

    from pqloader._processes import _died

    context = multiprocessing.get_context("fork")
    alive, dead = (context.Process(target=time.sleep, args=(60,)) for _ in range(2))
    done = context.Process(target=int)  # it ended its share (an IterableDataset's): no death
    for process in (alive, dead, done):
        process.start()
    done.join()
    try:
        os.kill(dead.pid, signal.SIGKILL)
        iterator = SimpleNamespace(  # torch's, as _died looks at it
            _workers=[alive, dead, done], _workers_status=[True, True, False])
        told = _died(iterator)
        assert isinstance(told, RuntimeError)
        assert re.search(rf"DataLoader worker exited unexpectedly \(pid {dead.pid}: killed by "
                         r"signal SIGKILL\) while its batch was being received", str(told))
        iterator._workers, iterator._workers_status = [alive, done], [True, False]
        assert _died(iterator, wait_s=0.1) is None  # the error raised as it came
    finally:
        for process in (alive, dead):
            process.kill()
            process.join()


@pytest.mark.parametrize("context", [None, "fork"])
def test_forked_worker_processes_leave_no_named_semaphore(
        make_dataset: Any, monkeypatch: pytest.MonkeyPatch, context: str | None) -> None:
    """Each pass made a spawn-context semaphore for its forked workers to count themselves up
    on: a named one in /dev/shm, left there when the job is killed (SIGKILL to the process
    group: one a pass; found in review). A fork one has no name, nothing to leave."""
    from multiprocessing import resource_tracker

    named: list[tuple[str, str]] = []
    monkeypatch.setattr(resource_tracker, "register",
                        lambda name, rtype: named.append((name, rtype)))
    ds = pqloader.ParquetDataset(make_dataset(400))
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=2, worker_type="process",
                                 multiprocessing_context=context)
    for _ in range(2):
        assert sum(len(b["id"]) for b in loader) == 400
    assert [n for n in named if n[1] == "semaphore"] == []


@pytest.mark.parametrize("kw", [{"num_workers": 0}, {"num_workers": 2},
                                {"num_workers": 2, "worker_type": "process"},
                                {"num_workers": "auto"}],
                         ids=["0", "threads", "processes", "auto"])
def test_a_pass_an_error_ended_says_so_when_asked_for_more(tmp_path: Path,
                                                           kw: dict[str, Any]) -> None:
    """A loop that catches a batch's error and goes on took the pass's StopIteration for
    the epoch's end: 0 of 2,400 rows, no word (found by fuzzing)."""
    root = tmp_path / "ds"
    pqloader.write_dataset(pa.table({"id": list(range(2400))}), root, rows_per_file=600,
                           row_group_size=200)
    shard = sorted(root.glob("part-*.parquet"))[1]
    data = bytearray(shard.read_bytes())
    data[300:364] = bytes(b ^ 0xFF for b in data[300:364])  # a data page of row group 0
    shard.write_bytes(bytes(data))
    loader = pqloader.DataLoader(pqloader.ParquetDataset(root), batch_size=100, shuffle=True,
                                 seed=0, **kw)
    for _ in range(2):  # a pass begun again meets the same error again
        it, told = iter(loader), []
        while True:
            try:
                next(it)
            except StopIteration:
                break
            except pqloader.PQLoaderError as exc:
                told.append(exc)
        assert [type(e) for e in told] == [pqloader.CorruptFileError,
                                           pqloader.IncompleteEpochError]
        assert shard.name in str(told[0]) and f"CorruptFileError: {told[0]}" in str(told[1])
        assert "the others were not delivered" in str(told[1])
        assert loader.state_dict()["batches"] < len(loader)  # a resume goes on from there


def _bad_row(batch: dict[str, Any]) -> dict[str, Any]:
    if 10 in batch["id"].tolist():
        raise ValueError("bad row 10")
    return batch


@pytest.mark.parametrize("workers", [0, 2])
def test_to_torch_under_torch_says_a_pass_an_error_ended(tmp_path: Path, workers: int) -> None:
    """Under torch's DataLoader, a loop that caught a transform's error and went on got a
    short epoch that ended as if whole (9 of 60 rows; with 2 torch workers, the other's 39):
    the next batch of the worker that failed is now IncompleteEpochError (found by fuzzing)."""
    pq.write_table(pa.table({"id": list(range(60))}), tmp_path / "p.parquet", row_group_size=6)
    ds = pqloader.ParquetDataset(tmp_path)
    it = iter(torch.utils.data.DataLoader(ds.to_torch(batch_size=3, transform=_bad_row),
                                          batch_size=None, num_workers=workers))
    told: list[str] = []
    rows = 0
    while True:
        try:
            rows += len(next(it)["id"])
        except StopIteration:
            break
        except Exception as exc:  # torch re-raises a worker's error as its own type
            told.append(f"{type(exc).__name__}: {exc}")
    assert [t.split(":")[0] for t in told] == ["ValueError", "IncompleteEpochError"], told
    assert "bad row 10" in told[1] and rows < 60
    # with torch's workers the others went on, out of turn: no start=k resumes (following it
    # lost 8 rows and repeated 8, found in review)
    assert ("set_epoch(epoch, start=k)" in told[1]) is (workers == 0), told[1]
