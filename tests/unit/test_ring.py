"""Batches from worker processes through reused slots of shared memory (``_ring.py``), with
real worker processes: the data as thread workers deliver it, whatever the consumer holds."""

from __future__ import annotations

import gc
import os
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import pqloader
from pqloader import _ring


def _dataset(tmp_path: Path, rows: int = 6_000) -> pqloader.ParquetDataset:
    rng = np.random.default_rng(0)
    table = pa.table({"id": np.arange(rows), **{f"f{i}": rng.random(rows, np.float32)
                                                for i in range(4)}})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=1_000)
    return pqloader.ParquetDataset(tmp_path)


def _loader(ds: pqloader.ParquetDataset, kind: str, **options: Any) -> pqloader.DataLoader:
    return pqloader.DataLoader(ds, batch_size=50, shuffle=True, seed=4, num_workers=2,
                               worker_type=kind, **options)


def _in_a_ring(t: torch.Tensor) -> bool:
    return any(a <= t.data_ptr() < b for a, b in _ring.mapped())


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_batches_let_go_come_through_the_rings_equal_to_thread_workers(tmp_path: Path) -> None:
    ds = _dataset(tmp_path)
    expected = list(_loader(ds, "thread"))
    ringed = 0
    for k, batch in enumerate(_loader(ds, "process")):  # each let go before the next
        assert _same(batch, expected[k]), k
        ringed += _in_a_ring(batch["f0"])
    assert ringed == len(expected) == 120  # slots freed were taken again: none went the
    # torch way (a ring holds 8)


def test_batches_the_caller_holds_are_never_overwritten(tmp_path: Path) -> None:
    """All 120 held: the rings' 16 slots fill, the rest go the torch way, none is written over."""
    ds = _dataset(tmp_path)
    expected = list(_loader(ds, "thread"))
    held = list(_loader(ds, "process", persistent_workers=True))
    assert len(held) == len(expected)
    assert all(_same(a, b) for a, b in zip(held, expected, strict=True))
    assert 0 < sum(_in_a_ring(b["f0"]) for b in held) < len(held)
    held.clear()  # their slots are free again: the next epoch's batches use them
    assert all(_in_a_ring(b["f0"]) for b in _loader(ds, "process"))


def _growing(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    first = int(batch["id"][0])  # a batch of 50 x (first + 1) values, all its first id
    return {"id": batch["id"], "big": torch.full((50, first + 1), first, dtype=torch.int32)}


def test_a_batch_larger_than_its_slots_makes_a_larger_ring(tmp_path: Path) -> None:
    ds = _dataset(tmp_path)
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=2, worker_type="process",
                                 transform=_growing)
    seen = 0
    for batch in loader:
        first = int(batch["id"][0])
        assert batch["big"].shape == (50, first + 1)
        assert bool((batch["big"] == first).all())
        seen += 1
    assert seen == 120


@pytest.mark.parametrize("persistent", [False, True])
def test_rings_of_ended_workers_are_let_go(tmp_path: Path, persistent: bool) -> None:
    """Not one ring more per epoch (non-persistent workers are new processes each epoch);
    earlier tests' rings, of workers maybe not yet ended, are not counted."""
    gc.collect()
    before = len(_ring.mapped())
    ds = _dataset(tmp_path)
    loader = _loader(ds, "process", persistent_workers=persistent)
    for epoch in range(3):
        loader.set_epoch(epoch)
        assert sum(1 for _ in loader) == 120
        assert len(_ring.mapped()) <= before + (2 if persistent else 0)


def test_a_forked_child_letting_go_of_a_batch_does_not_free_its_slot(tmp_path: Path) -> None:
    """The child's copy is not the parent's batch: let go there (at the child's exit, say), the
    slot was marked free for the worker to write over while the parent held the batch."""
    ds = _dataset(tmp_path)
    it = iter(_loader(ds, "process", persistent_workers=True))
    batch = next(it)
    assert _in_a_ring(batch["f0"])
    expected = {k: v.clone() for k, v in batch.items()}
    child = os.fork()
    if child == 0:  # exit as a normal process does: atexit runs the finalizers left (and
        weakref.finalize._exitfunc()  # type: ignore[attr-defined]  # more, not run here)
        os._exit(0)
    assert os.waitpid(child, 0)[1] == 0
    rest = [next(it) for _ in range(40)]  # the workers would reuse a slot freed by the child
    assert _same(batch, expected) and len(rest) == 40
