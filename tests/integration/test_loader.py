"""pqloader.DataLoader end to end: real threads, real worker processes, real torch, real gloo."""

from __future__ import annotations

import collections
import functools
import gc
import json
import os
import random
import socket
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing
import torch.utils.data

import pqloader

ROWS = 1000  # the make_dataset default: 4 files, 10 row groups of 100 rows
BATCH = 64  # 1000 = 15 * 64 + 40: the last batch is short

THREADS = pytest.param({"num_workers": 2}, id="threads")
PROCESSES = pytest.param({"num_workers": 2, "worker_type": "process"}, id="processes")
INLINE = pytest.param({"num_workers": 0}, id="inline")
AUTO = pytest.param({"num_workers": "auto"}, id="auto")


# -- helpers --------------------------------------------------------------------------------------
def _children() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if any("resource_tracker" in part for part in p.cmdline()):
                continue  # multiprocessing's, started once by spawn and kept for the session
        except psutil.NoSuchProcess:
            continue
        out.append(p)
    return out


def _pqloader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("pqloader-worker")]


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Every test must leave no worker process nor worker thread behind."""
    before = {p.pid for p in _children()}
    yield
    gc.collect()
    deadline = time.monotonic() + 5
    while True:
        procs = [p for p in _children() if p.pid not in before]
        threads = _pqloader_threads()
        if not procs and not threads:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"leaked worker processes {procs} or threads {threads}")
        time.sleep(0.05)


@pytest.fixture
def ds(make_dataset: Any) -> pqloader.ParquetDataset:
    return pqloader.ParquetDataset(make_dataset(ROWS))


def ids_of(batches: Iterable[Any]) -> list[list[int]]:
    return [b["id"].tolist() for b in batches]


def flat(batches: list[list[int]]) -> list[int]:
    return [i for b in batches for i in b]


# -- exactly once ---------------------------------------------------------------------------------
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("mode", [INLINE, THREADS, PROCESSES, AUTO])
def test_every_row_once(ds: pqloader.ParquetDataset, mode: dict[str, Any], shuffle: bool,
                        drop_last: bool) -> None:
    loader = pqloader.DataLoader(ds, batch_size=BATCH, shuffle=shuffle, drop_last=drop_last,
                                 seed=5, shuffle_window_rows=250, **mode)
    batches = ids_of(loader)
    assert len(batches) == len(loader)
    sizes = [len(b) for b in batches]
    ids = flat(batches)
    assert len(ids) == len(set(ids)), "a row came twice"
    if drop_last:
        assert sizes == [BATCH] * (ROWS // BATCH)
        assert len(ids) == ROWS - ROWS % BATCH
    else:
        assert sizes == [BATCH] * (ROWS // BATCH) + [ROWS % BATCH]
        assert sorted(ids) == list(range(ROWS))
    if not shuffle:
        # each batch is a run of consecutive rows; with workers, each worker reads a
        # contiguous span of the file order and batches alternate between workers
        assert all(b == list(range(b[0], b[0] + len(b))) for b in batches)
        if mode["num_workers"] == 0:
            assert ids == list(range(len(ids)))
    else:
        assert ids != sorted(ids)


@pytest.mark.parametrize("mode", [THREADS, PROCESSES])
def test_len_matches_for_many_shapes(make_dataset: Any, mode: dict[str, Any]) -> None:
    ds = pqloader.ParquetDataset(make_dataset(257, rows_per_file=50, row_group_size=20),
                                 columns=["id"])
    for batch_size in (1, 7, 20, 256, 257, 1000):
        for drop_last in (False, True):
            loader = pqloader.DataLoader(ds, batch_size=batch_size, drop_last=drop_last,
                                         shuffle=True, **mode)
            batches = ids_of(loader)
            assert len(batches) == len(loader), (batch_size, drop_last)
            ids = flat(batches)
            assert len(ids) == len(set(ids))
            if not drop_last:
                assert sorted(ids) == list(range(257))
            else:
                assert len(ids) == 257 - 257 % batch_size


# -- epochs ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [THREADS, PROCESSES])
def test_epochs_differ_and_repeat(ds: pqloader.ParquetDataset, mode: dict[str, Any]) -> None:
    loader = pqloader.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=1,
                                 shuffle_window_rows=250, **mode)
    epoch0 = ids_of(loader)
    following = ids_of(loader)  # without set_epoch, the next epoch (as torch's shuffle=True)
    assert loader.epoch == 1
    loader.set_epoch(1)
    assert loader.epoch == 1
    epoch1 = ids_of(loader)
    assert epoch1 != epoch0 and following == epoch1
    assert sorted(flat(epoch1)) == list(range(ROWS))
    loader.set_epoch(0)
    assert ids_of(loader) == epoch0
    other = pqloader.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=1,
                                shuffle_window_rows=250, **mode)
    other.set_epoch(1)
    assert ids_of(other) == epoch1  # a fresh loader: the same order for the same epoch
    reseeded = pqloader.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=2,
                                   shuffle_window_rows=250, **mode)
    assert ids_of(reseeded) != epoch0


# -- ranks ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("mode", [THREADS, PROCESSES])
def test_ranks_cover_every_row(ds: pqloader.ParquetDataset, mode: dict[str, Any],
                               drop_last: bool) -> None:
    world_size = 3
    per_rank = []
    for rank in range(world_size):
        loader = pqloader.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=7, rank=rank,
                                     world_size=world_size, drop_last=drop_last, **mode)
        batches = ids_of(loader)
        assert len(batches) == len(loader)
        per_rank.append(batches)
    counts = {len(b) for b in per_rank}
    assert len(counts) == 1, f"ranks yield different batch counts: {counts}"
    seen = collections.Counter(i for batches in per_rank for i in flat(batches))
    repeats = sum(c - 1 for c in seen.values())
    if drop_last:
        assert repeats == 0
        assert ROWS - len(seen) < world_size * BATCH
    else:
        assert set(seen) == set(range(ROWS))
        assert repeats <= world_size - 1
    for a in range(world_size):  # and the ranks really are different shards
        for b in range(a + 1, world_size):
            overlap = set(flat(per_rank[a])) & set(flat(per_rank[b]))
            assert len(overlap) <= world_size - 1


# -- batches --------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [INLINE, THREADS, PROCESSES])
def test_batch_types(ds: pqloader.ParquetDataset, mode: dict[str, Any]) -> None:
    rows = {r["id"]: r for r in ds.__getitems__(range(ROWS))}
    loader = pqloader.DataLoader(ds, batch_size=BATCH, shuffle=True, **mode)
    n = 0
    for batch in loader:
        assert set(batch) == {"id", "x", "tokens", "tokens_lengths", "text"}
        ids = batch["id"]
        size = len(ids)
        assert isinstance(ids, torch.Tensor) and ids.dtype == torch.int64
        assert ids.shape == (size,)
        assert batch["x"].dtype == torch.float32 and batch["x"].shape == (size,)
        tokens, lengths = batch["tokens"], batch["tokens_lengths"]
        assert tokens.dtype == torch.int32
        assert tokens.ndim == 2 and tokens.shape[0] == size
        assert tokens.shape[1] == int(lengths.max())
        assert lengths.dtype == torch.int64 and lengths.shape == (size,)
        assert isinstance(batch["text"], list) and all(isinstance(t, str) for t in batch["text"])
        for k, i in enumerate(ids.tolist()):
            row = rows[i]
            assert batch["text"][k] == row["text"]
            assert batch["x"][k].item() == pytest.approx(row["x"])
            length = int(lengths[k])
            assert length == len(row["tokens"])
            assert tokens[k, :length].tolist() == row["tokens"]
            assert not tokens[k, length:].any()  # padded with zeros
        n += size
    assert n == ROWS


def noisy(batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    batch["noise"] = torch.from_numpy(rng.random(len(batch["id"])))
    batch["x"] = batch["x"] + torch.from_numpy(rng.normal(size=len(batch["id"])).astype("f4"))
    return batch


def _noise(loader: pqloader.DataLoader) -> list[tuple[list[int], list[float]]]:
    return [(b["id"].tolist(), b["noise"].tolist()) for b in loader]


@pytest.mark.parametrize("mode", [THREADS, PROCESSES])
def test_random_transform_is_reproducible(ds: pqloader.ParquetDataset,
                                          mode: dict[str, Any]) -> None:
    def make() -> pqloader.DataLoader:
        return pqloader.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=3, transform=noisy,
                                   **mode)

    first, second = _noise(make()), _noise(make())
    assert first == second
    assert len({n for _, noise in first for n in noise}) == ROWS  # really drawn per row
    loader = make()
    loader.set_epoch(1)
    other_epoch = _noise(loader)
    assert [noise for _, noise in other_epoch] != [noise for _, noise in first]
    # the same draws in the caller, in threads and in processes
    inline = pqloader.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=3, transform=noisy,
                                 num_workers=2, worker_type="thread")
    assert _noise(inline) == first


def _draw(batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    batch["drawn"] = torch.from_numpy(rng.permutation(1000)[:len(batch["id"])])
    return batch


@pytest.mark.parametrize("workers", [0, "auto", 2])
def test_a_random_transform_draws_apart_from_the_shuffle(tmp_path: Path,
                                                         workers: int | str) -> None:
    """Its generator is not the one that permuted the epoch's rows: rank 0's first batch drew
    the very permutation its rows came in (numpy's seeds drop trailing zeros)."""
    pq.write_table(pa.table({"id": pa.array(range(1000), pa.int64())}), tmp_path / "a.parquet")
    ds = pqloader.ParquetDataset(tmp_path)
    for seed, epoch in [(0, 0), (7, 0), (7, 3)]:
        loader = pqloader.DataLoader(ds, batch_size=64, shuffle=True, seed=seed,
                                     transform=_draw, num_workers=workers)
        loader.set_epoch(epoch)
        batches = list(loader)
        assert len(batches) == 16
        assert not any(torch.equal(b["drawn"], b["id"]) for b in batches)


def _collate(batch: pa.RecordBatch) -> dict[str, Any]:
    return {"type": type(batch).__name__, "is_record_batch": isinstance(batch, pa.RecordBatch),
            "names": batch.schema.names, "id": batch.column("id").to_pylist(),
            "pid": os.getpid(), "thread": threading.current_thread().name}


@pytest.mark.parametrize("mode", [INLINE, THREADS, PROCESSES])
def test_collate_fn_gets_a_record_batch(ds: pqloader.ParquetDataset,
                                        mode: dict[str, Any]) -> None:
    loader = pqloader.DataLoader(ds, batch_size=BATCH, collate_fn=_collate, **mode)
    out = list(loader)
    assert len(out) == len(loader)
    assert all(b["is_record_batch"] for b in out), {b["type"] for b in out}
    assert all(b["names"] == ["id", "x", "tokens", "text"] for b in out)
    assert sorted(flat([b["id"] for b in out])) == list(range(ROWS))
    if mode.get("worker_type") == "process":
        assert all(b["pid"] != os.getpid() for b in out)
    elif mode["num_workers"]:
        assert all(b["thread"].startswith("pqloader-worker") for b in out)


def _record_init(folder: str, worker_id: int) -> None:
    name = f"{worker_id}-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
    Path(folder, name).touch()


def _inits(folder: Path) -> list[int]:
    return sorted(int(p.name.split("-")[0]) for p in folder.iterdir())


@pytest.mark.parametrize("mode", [THREADS, PROCESSES])
def test_worker_init_fn_once_per_worker(ds: pqloader.ParquetDataset, tmp_path: Path,
                                        mode: dict[str, Any]) -> None:
    folder = tmp_path / "inits"
    folder.mkdir()
    loader = pqloader.DataLoader(ds, batch_size=BATCH,
                                 worker_init_fn=functools.partial(_record_init, str(folder)),
                                 **mode)
    assert len(ids_of(loader)) == len(loader)
    assert _inits(folder) == [0, 1]


def test_worker_init_fn_persistent_processes(ds: pqloader.ParquetDataset,
                                             tmp_path: Path) -> None:
    folder = tmp_path / "inits"
    folder.mkdir()
    loader = pqloader.DataLoader(ds, batch_size=BATCH, num_workers=2, worker_type="process",
                                 persistent_workers=True,
                                 worker_init_fn=functools.partial(_record_init, str(folder)))
    for epoch in range(3):
        loader.set_epoch(epoch)
        assert sorted(flat(ids_of(loader))) == list(range(ROWS))
    assert _inits(folder) == [0, 1]  # the same two processes served every epoch
    del loader


def _seed_worker(worker_id: int) -> None:  # torch's docs' worker_init_fn, and more
    torch.manual_seed(1234 + worker_id)
    np.random.seed(torch.initial_seed() % 2**32)
    random.seed(worker_id)


def _no_seeding(worker_id: int) -> None:
    torch.rand(1)  # a draw is no seeding


def test_a_worker_init_fn_reseeds_no_generator_of_the_training_loop(
        ds: pqloader.ParquetDataset) -> None:
    """Thread workers share the process's generators: torch's docs' seed_worker reseeded the
    loop's at every epoch's start, its dropout the same each epoch (found in review)."""
    torch.manual_seed(1234)  # worker 0's seed too: its initial_seed stays (found in review)
    np.random.seed(0)
    random.seed(0)
    torch.rand(1)
    loader = pqloader.DataLoader(ds, batch_size=BATCH, num_workers=2, shuffle=True,
                                 worker_init_fn=_seed_worker)
    draws = []
    with pytest.warns(RuntimeWarning, match="worker_init_fn called torch.manual_seed, "
                      "np.random.seed(, random.seed)?: thread workers share") as caught:
        for epoch in range(3):
            loader.set_epoch(epoch)
            assert sorted(flat(ids_of(loader))) == list(range(ROWS))
            draws.append((float(torch.rand(1)), float(np.random.rand()), random.random()))
    assert caught
    assert len(set(draws)) == 3, draws  # not the same first draws after each epoch
    # one worker, seeding what the loop seeded: torch's initial_seed stays the same
    torch.manual_seed(1234)
    torch.rand(1)
    loader = pqloader.DataLoader(ds, batch_size=BATCH, num_workers=1,
                                 worker_init_fn=_seed_worker)
    with pytest.warns(RuntimeWarning, match="worker_init_fn called torch.manual_seed"):
        firsts = []
        for epoch in range(3):
            loader.set_epoch(epoch)
            ids_of(loader)
            firsts.append(float(torch.rand(1)))
    assert len(set(firsts)) == 3, firsts
    # a worker_init_fn that only draws changes nothing, and is not warned of
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(ids_of(pqloader.DataLoader(ds, batch_size=BATCH, num_workers=2,
                                              worker_init_fn=_no_seeding))) > 0


def test_worker_init_fns_that_wait_for_each_other_or_never_return_hold_up_no_other(
        ds: pqloader.ParquetDataset) -> None:
    """Run one at a time to keep the generators apart, two inits at a barrier waited forever,
    and one that never returned held up every later loader's (found in review)."""
    barrier = threading.Barrier(2, timeout=30)  # broken, not hung, if they run one at a time
    loader = pqloader.DataLoader(ds, batch_size=BATCH, num_workers=2,
                                 worker_init_fn=lambda i: barrier.wait())
    assert sorted(flat(ids_of(loader))) == list(range(ROWS))
    stuck, started = threading.Event(), threading.Event()

    def stuck_init(i: int) -> None:
        started.set()
        stuck.wait()

    first = pqloader.DataLoader(ds, batch_size=BATCH, num_workers=1,
                                worker_init_fn=stuck_init)
    waiting = threading.Thread(target=lambda: list(first))
    waiting.start()
    try:
        assert started.wait(30)
        second = pqloader.DataLoader(ds, batch_size=BATCH, num_workers=1, timeout=30,
                                     worker_init_fn=lambda i: None)
        assert sorted(flat(ids_of(second))) == list(range(ROWS))
    finally:
        stuck.set()
        waiting.join()


def test_persistent_processes_follow_set_epoch(ds: pqloader.ParquetDataset) -> None:
    kw: dict[str, Any] = {"batch_size": BATCH, "shuffle": True, "seed": 11,
                          "shuffle_window_rows": 250}
    threads = pqloader.DataLoader(ds, num_workers=2, **kw)
    expected = []
    for epoch in range(3):
        threads.set_epoch(epoch)
        expected.append(ids_of(threads))
    assert expected[0] != expected[1] != expected[2]
    loader = pqloader.DataLoader(ds, num_workers=2, worker_type="process",
                                 persistent_workers=True, **kw)
    others = {p.pid for p in _children()}  # servers that session fixtures started
    pids = set()
    for epoch in (0, 1, 2, 1):
        loader.set_epoch(epoch)
        assert ids_of(loader) == expected[epoch], f"epoch {epoch}"
        pids.update(p.pid for p in _children() if p.pid not in others)
    assert len(pids) == 2  # persistent: the same two workers throughout
    del loader


# -- modes agree ----------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize("shuffle", [False, True])
def test_modes_give_the_same_batches(ds: pqloader.ParquetDataset, shuffle: bool) -> None:
    kw: dict[str, Any] = {"batch_size": BATCH, "shuffle": shuffle, "seed": 4,
                          "shuffle_window_rows": 200}

    def run(**mode: Any) -> list[list[int]]:
        loader = pqloader.DataLoader(ds, **kw, **mode)
        loader.set_epoch(2)
        return ids_of(loader)

    one = run(num_workers=0)
    assert run(num_workers=1) == one
    assert run(num_workers=1, worker_type="process") == one
    two = run(num_workers=2)
    assert run(num_workers=2, worker_type="process") == two
    three = run(num_workers=3)
    assert run(num_workers=3, worker_type="process") == three
    for batches in (two, three):
        assert sorted(flat(batches)) == sorted(flat(one))


def test_batches_equal_across_modes_with_all_columns(ds: pqloader.ParquetDataset) -> None:
    def run(**mode: Any) -> list[dict[str, Any]]:
        loader = pqloader.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=9, **mode)
        return list(loader)

    a, b = run(num_workers=2), run(num_workers=2, worker_type="process")
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            if isinstance(x[key], torch.Tensor):
                assert torch.equal(x[key], y[key]), key
            else:
                assert x[key] == y[key], key


# -- num_workers="auto" ---------------------------------------------------------------------------
def _restless(loader: pqloader.DataLoader) -> pqloader.DataLoader:
    """Make the loader's tuner change its thread count after every batch or two."""
    from pqloader._autotune import ThreadTuner

    streams = loader.workers.num_workers
    loader._tuner = ThreadTuner(streams, interval_s=0.0, min_batches=1, settle_batches=0,
                                hold_intervals=1)
    return loader


def test_auto_tuning_changes_speed_never_batches(ds: pqloader.ParquetDataset) -> None:
    from pqloader._config import MAX_AUTO_WORKERS, cores

    kw: dict[str, Any] = {"batch_size": 16, "shuffle": True, "seed": 3, "shuffle_window_rows": 150}
    auto = _restless(pqloader.DataLoader(ds, num_workers="auto", **kw))
    streams = min(MAX_AUTO_WORKERS, cores())
    assert auto.workers.num_workers == streams
    fixed = pqloader.DataLoader(ds, num_workers=0, **kw)  # auto plans one stream, as 0 does
    for epoch in (0, 1):
        auto.set_epoch(epoch)
        fixed.set_epoch(epoch)
        assert ids_of(auto) == ids_of(fixed)
    report = auto.autotune
    assert report is not None and report.changes > 0 and 0 <= report.threads <= streams
    assert pqloader.DataLoader(ds, batch_size=16, num_workers=2).autotune is None


def test_auto_resumes_exactly(ds: pqloader.ParquetDataset) -> None:
    kw: dict[str, Any] = {"batch_size": 16, "shuffle": True, "seed": 8, "num_workers": "auto"}
    full = ids_of(_restless(pqloader.DataLoader(ds, **kw)))
    first = _restless(pqloader.DataLoader(ds, **kw))
    it = iter(first)
    head = [next(it)["id"].tolist() for _ in range(21)]
    state = json.loads(json.dumps(first.state_dict()))
    del it
    second = _restless(pqloader.DataLoader(ds, **kw))
    second.load_state_dict(state)
    assert head + ids_of(second) == full


def test_auto_and_zero_workers_resume_each_other_exactly(ds: pqloader.ParquetDataset) -> None:
    kw: dict[str, Any] = {"batch_size": 16, "shuffle": True, "seed": 5}
    full = ids_of(pqloader.DataLoader(ds, num_workers=0, **kw))
    for saver, restorer in (("auto", 0), (0, "auto")):
        first = pqloader.DataLoader(ds, num_workers=saver, **kw)
        it = iter(first)
        head = [next(it)["id"].tolist() for _ in range(9)]
        state = json.loads(json.dumps(first.state_dict()))
        del it
        second = pqloader.DataLoader(ds, num_workers=restorer, **kw)
        second.load_state_dict(state)
        assert head + ids_of(second) == full, (saver, restorer)


def test_an_automatic_window_takes_the_states_and_resumes_exactly(
        ds: pqloader.ParquetDataset) -> None:
    # A state saved by another pqloader version, whose estimate of decoded bytes sized the
    # window differently: as one with an explicit window of another size.
    kw: dict[str, Any] = {"batch_size": 16, "shuffle": True, "seed": 4, "num_workers": 2}
    auto_rows = pqloader.DataLoader(ds, **kw)._planner.window_rows
    saved = pqloader.DataLoader(ds, shuffle_window_rows=auto_rows // 3, **kw)
    full = ids_of(saved)
    saved.set_epoch(0)  # again (else the next epoch)
    it = iter(saved)
    head = [next(it)["id"].tolist() for _ in range(7)]
    state = json.loads(json.dumps(saved.state_dict()))
    del it
    restored = pqloader.DataLoader(ds, **kw)
    restored.load_state_dict(state)
    assert head + ids_of(restored) == full  # not elastic: the same windows
    assert restored.state_dict()["settings"]["shuffle_window_rows"] == auto_rows // 3
    explicit = pqloader.DataLoader(ds, shuffle_window_rows=auto_rows // 2, **kw)
    explicit.load_state_dict(state)  # a window the user set is kept: elastic
    rest = ids_of(explicit)
    flat = [i for batches in (head, rest) for batch in batches for i in batch]
    assert sorted(flat) == sorted(i for batch in full for i in batch)


def test_auto_needs_thread_workers(ds: pqloader.ParquetDataset) -> None:
    with pytest.raises(pqloader.InvalidArgumentError, match="worker_type='process'"):
        pqloader.DataLoader(ds, batch_size=8, num_workers="auto", worker_type="process")
    with pytest.raises(pqloader.InvalidArgumentError, match="num_workers"):
        pqloader.DataLoader(ds, batch_size=8, num_workers="many")  # type: ignore[arg-type]


# -- early exit -----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [THREADS, PROCESSES])
def test_break_early_then_iterate_again(ds: pqloader.ParquetDataset,
                                        mode: dict[str, Any]) -> None:
    loader = pqloader.DataLoader(ds, batch_size=BATCH, shuffle=True, prefetch_factor=1, **mode)
    full = ids_of(loader)
    loader.set_epoch(0)
    for k, batch in enumerate(loader):
        assert batch["id"].tolist() == full[k]
        if k == 2:
            break
    with pytest.warns(UserWarning, match="this pass starts epoch 0 over"):
        assert ids_of(loader) == full


# -- torch's own DataLoader over to_torch() -------------------------------------------------------
def test_to_torch_under_torch_workers(ds: pqloader.ParquetDataset) -> None:
    it = ds.to_torch(batch_size=BATCH, shuffle=True, seed=0)
    assert isinstance(it, pqloader.TorchIterable)
    assert isinstance(it, torch.utils.data.IterableDataset)
    loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2)
    batches = ids_of(loader)
    assert len(batches) == len(loader) == len(it) == -(-ROWS // BATCH)
    assert sorted(flat(batches)) == list(range(ROWS))
    assert flat(batches) != list(range(ROWS))
    same = pqloader.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=0, num_workers=2)
    assert ids_of(same) == batches  # torch's workers split the work as pqloader's do
    assert ids_of(loader) == batches


def test_to_torch_inline(ds: pqloader.ParquetDataset) -> None:
    it = ds.to_torch(batch_size=BATCH, drop_last=True)
    batches = ids_of(it)
    assert flat(batches) == list(range(ROWS - ROWS % BATCH))


def test_to_torch_under_torch_collation_says_batch_size_none(
        ds: pqloader.ParquetDataset) -> None:
    """torch's DataLoader without batch_size=None collates, in its workers, the batches they
    packed: torch's "default_collate: batch must contain tensors..." named a class of
    pqloader's (found in review). In the caller's process batches are plain dicts, which
    torch collates as it does any (merging batches on purpose stays possible)."""
    it = ds.to_torch(batch_size=BATCH)
    with pytest.raises(Exception, match=r"pass it batch_size=None"):
        next(iter(torch.utils.data.DataLoader(it, num_workers=2)))
    for workers in (0, 2):
        batch = next(iter(torch.utils.data.DataLoader(it, batch_size=None,
                                                      num_workers=workers)))
        assert type(batch) is dict and batch["id"].shape == (BATCH,)
    merged = next(iter(torch.utils.data.DataLoader(it, batch_size=2)))
    assert merged["id"].shape == (2, BATCH)


def test_to_torch_set_epoch_reaches_persistent_workers(ds: pqloader.ParquetDataset) -> None:
    it = ds.to_torch(batch_size=BATCH, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2,
                                         persistent_workers=True)
    reference = pqloader.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=0, num_workers=2)
    epoch0 = ids_of(loader)
    it.set_epoch(1)
    epoch1 = ids_of(loader)
    reference.set_epoch(1)
    assert epoch1 == ids_of(reference)
    assert epoch1 != epoch0
    assert sorted(flat(epoch1)) == list(range(ROWS))
    it.set_epoch(0)
    assert ids_of(loader) == epoch0
    del loader


# -- a real torch.distributed group ---------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ddp_worker(rank: int, world_size: int, port: int, source: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    try:
        ds = pqloader.ParquetDataset(source, columns=["id"])
        loader = pqloader.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=3, num_workers=2)
        loader.set_epoch(1)
        batches = ids_of(loader)
        mine = {"rank": rank, "world": [loader.config.world.rank, loader.config.world.world_size],
                "len": len(loader), "batches": batches}
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, mine)
        counts = torch.tensor([len(batches)])
        dist.all_reduce(counts)  # a collective per rank: equal counts or this would hang
        if rank == 0:
            Path(out).write_text(json.dumps({"gathered": gathered, "sum": int(counts)}))
    finally:
        dist.destroy_process_group()


def _built_before_init(rank: int, world_size: int, port: int, source: str, out: str) -> None:
    ds = pqloader.ParquetDataset(source, columns=["id"])
    early = pqloader.DataLoader(ds, batch_size=BATCH, num_workers=0)  # no process group yet
    early_torch = ds.to_torch(batch_size=BATCH)
    on_purpose = pqloader.DataLoader(ds, batch_size=BATCH, num_workers=0, rank=0, world_size=1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    try:
        told = []
        spawned = torch.utils.data.DataLoader(  # its workers see no process group
            early_torch, batch_size=None, num_workers=1, multiprocessing_context="spawn")
        for it in (early, early_torch, spawned):
            try:
                next(iter(it))
                told.append("")
            except pqloader.InvalidArgumentError as exc:
                told.append(str(exc))
        rows = len(flat(ids_of(on_purpose)))
        Path(f"{out}.{rank}").write_text(json.dumps({"told": told, "rows": rows}))
    finally:
        dist.destroy_process_group()


def test_a_loader_built_before_init_process_group_is_refused(make_dataset: Any,
                                                              tmp_path: Path) -> None:
    """It took one rank, so each rank would have had every row, silently."""
    source = make_dataset(ROWS, rows_per_file=250, row_group_size=50)
    out = tmp_path / "result"
    torch.multiprocessing.spawn(_built_before_init, args=(2, _free_port(), str(source),
                                                          str(out)), nprocs=2, join=True)
    for rank in range(2):
        result = json.loads(Path(f"{out}.{rank}").read_text())
        for told in result["told"]:
            assert "built before torch.distributed.init_process_group" in told, told
        assert result["rows"] == ROWS  # rank=0, world_size=1 given: every row, as asked


def test_a_launched_process_without_a_process_group_is_refused(
        make_dataset: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's processes (WORLD_SIZE set) that never called init_process_group each took
    one rank, and each read every row, silently (found in review)."""
    ds = pqloader.ParquetDataset(make_dataset(ROWS), columns=["id"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    for it in (pqloader.DataLoader(ds, batch_size=BATCH, num_workers=0),
               ds.to_torch(batch_size=BATCH)):
        with pytest.raises(pqloader.InvalidArgumentError, match=r"WORLD_SIZE=2 .*not initialised"):
            next(iter(it))
    on_purpose = pqloader.DataLoader(ds, batch_size=BATCH, num_workers=0, rank=0, world_size=1)
    assert len(flat(ids_of(on_purpose))) == ROWS
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert len(flat(ids_of(pqloader.DataLoader(ds, batch_size=BATCH, num_workers=0)))) == ROWS


def test_torch_distributed_gloo(make_dataset: Any, tmp_path: Path) -> None:
    source = make_dataset(ROWS, rows_per_file=250, row_group_size=50)
    out = tmp_path / "result.json"
    world_size = 2
    torch.multiprocessing.spawn(_ddp_worker, args=(world_size, _free_port(), str(source),
                                                   str(out)),
                                nprocs=world_size, join=True)
    result = json.loads(out.read_text())
    gathered = sorted(result["gathered"], key=lambda r: r["rank"])
    assert [r["world"] for r in gathered] == [[0, 2], [1, 2]]  # taken from torch.distributed
    counts = [len(r["batches"]) for r in gathered]
    assert counts[0] == counts[1] == gathered[0]["len"] == gathered[1]["len"]
    assert result["sum"] == sum(counts)
    seen = collections.Counter(flat(gathered[0]["batches"]) + flat(gathered[1]["batches"]))
    assert set(seen) == set(range(ROWS))
    assert sum(c - 1 for c in seen.values()) <= world_size - 1


def test_a_shuffle_window_of_one_row_group_is_warned_of(tmp_path: Path) -> None:
    """Batches of such a loader never mix row groups or files, which shuffle=True says it
    does (found in review: 1.0-1.1 files a batch on images in 157 MB row groups)."""
    table = pa.table({"id": np.arange(3_000), "blob": pa.array([bytes(10_000)] * 3_000)})
    pqloader.write_dataset(table, tmp_path, rows_per_file=1_000, row_group_size=1_000)
    ds = pqloader.ParquetDataset(tmp_path)
    budget = 100 * 2**20  # windows of ~40 rows: it leaves 10 MiB a window, row groups take 10
    with pytest.warns(UserWarning, match=r"holds no more than one of this dataset's row "
                                         r"groups, which hold ~1,000 rows \(e\.g\. .*part-"):
        loader = pqloader.DataLoader(ds, batch_size=32, shuffle=True, num_workers=0,
                                     memory_budget_bytes=budget)
    assert sorted(int(i) for b in loader for i in b["id"]) == list(range(3_000))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for quiet in ({"shuffle": False}, {"shuffle_window_rows": 40},
                      {"memory_budget_bytes": None}):
            pqloader.DataLoader(ds, batch_size=32, **{"shuffle": True, "num_workers": 0,
                                                      "memory_budget_bytes": budget, **quiet})
    with pytest.warns(UserWarning, match="permutes the rows of one row group") as seen:
        ds.to_torch(batch_size=32, shuffle=True, memory_budget_bytes=budget)
    assert seen[0].filename == __file__  # the user's line, through to_torch too


def test_row_groups_of_one_row_are_not_warned_of(tmp_path: Path) -> None:
    """A window of one row of them is a full shuffle: row groups are shuffled."""
    table = pa.table({"id": np.arange(20), "blob": pa.array([bytes(2_000_000)] * 20)})
    pqloader.write_dataset(table, tmp_path, row_group_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = pqloader.DataLoader(pqloader.ParquetDataset(tmp_path), batch_size=1,
                                     shuffle=True, num_workers=0, memory_budget_bytes=60 * 2**20)
    assert loader._planner.window_rows == 1
