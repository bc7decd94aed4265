"""Batches from worker processes through reused slots of shared memory (``_ring.py``), with
real worker processes: the data as thread workers deliver it, whatever the consumer holds."""

from __future__ import annotations

import collections
import gc
import os
import threading
import time
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
    loader = _loader(ds, "process", persistent_workers=True)  # kept: its rings stay mapped
    held = list(loader)
    assert len(held) == len(expected)
    assert all(_same(a, b) for a, b in zip(held, expected, strict=True))
    assert 0 < sum(_in_a_ring(b["f0"]) for b in held) < len(held)
    held.clear()  # their slots are free again: the next epoch's batches use them
    assert all(_in_a_ring(b["f0"]) for b in _loader(ds, "process"))


def test_a_deeper_prefetch_gets_as_many_slots_more(tmp_path: Path) -> None:
    """prefetch_factor=12: each worker has up to 12 batches in flight while the caller holds
    its last 4 (2 per worker): 14 slots a worker at least, where a ring of 8 sent the rest the
    torch way. The caller is slow, so that the workers fill their prefetch."""
    ds = _dataset(tmp_path)
    expected = list(_loader(ds, "thread"))
    held: collections.deque[dict[str, torch.Tensor]] = collections.deque(maxlen=4)
    ringed = 0
    for k, batch in enumerate(_loader(ds, "process", prefetch_factor=12)):
        assert _same(batch, expected[k]), k
        ringed += _in_a_ring(batch["f0"])
        held.append(batch)
        time.sleep(0.005)
    assert ringed == len(expected) == 120


def test_a_ring_has_as_many_slots_as_fit_up_to_its_header(monkeypatch) -> None:
    """A deep prefetch whose slots did not all fit fell back to 4 (the default got 8), and
    slots past the header's 63 flags were made but never taken (found in review)."""
    monkeypatch.setattr(_ring, "_ring", None)
    monkeypatch.setattr(_ring, "_slots", _ring.SLOTS)
    monkeypatch.setattr(_ring, "_room", lambda: 8 * 64 * 2**20)  # 64 MiB a ring at most
    for prefetch, nbytes, slots in ((2, 4 << 20, 8), (12, 4 << 20, 12), (64, 1 << 20, 51),
                                    (70, 4096, 63)):
        _ring.in_flight(prefetch)
        _ring._ring = None
        taken = _ring.take(nbytes)
        assert taken is not None and len(taken[0].slots) == slots, (prefetch, nbytes)


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
    before = len(_ring._mapped)
    ds = _dataset(tmp_path)
    loader = _loader(ds, "process", persistent_workers=persistent)
    for epoch in range(3):
        loader.set_epoch(epoch)
        assert sum(1 for _ in loader) == 120
        assert len(_ring._mapped) <= before + (2 if persistent else 0)


def test_rings_of_persistent_workers_are_let_go_with_their_loader(tmp_path: Path) -> None:
    """They stayed mapped (2 workers x 9 segments, up to 2 x 256 MiB of /dev/shm) until a
    later process loader's first batch (found in a soak test)."""
    gc.collect()
    before = set(_ring._mapped)
    loader = _loader(_dataset(tmp_path), "process", persistent_workers=True)
    assert sum(1 for _ in loader) == 120
    ours = set(_ring._mapped) - before
    assert len(ours) == 2
    del loader
    assert not ours & set(_ring._mapped)


def test_a_batch_a_forked_child_holds_is_not_written_over(tmp_path: Path) -> None:
    """A child forked while the parent holds a batch (a saver or a logger given it) shares its
    slot: the parent letting go freed it for the worker to write over what the child read
    (found in review). The child only reads a pipe and compares (a fork of a process with
    threads: nothing that may take a lock)."""
    ds = _dataset(tmp_path)
    it = iter(_loader(ds, "process", persistent_workers=True))
    batch = next(it)
    assert _in_a_ring(batch["f0"])
    expected = batch["f0"].numpy().copy()
    ready, go = os.pipe()
    child = os.fork()
    if child == 0:
        os.read(ready, 1)  # the parent has let go and the workers have written more
        os._exit(0 if np.array_equal(batch["f0"].numpy(), expected) else 1)
    del batch
    gc.collect()
    rest = [next(it)["f0"].clone() for _ in range(40)]  # the workers reuse slots freed
    os.write(go, b"x")
    assert os.waitpid(child, 0)[1] == 0, "the child's batch was written over"
    assert len(rest) == 40


def test_under_the_file_system_sharing_strategy_batches_go_the_torch_way(
        tmp_path: Path) -> None:
    """There a segment lives until every process that mapped it lets go, and a worker ends
    with os._exit: each epoch's rings were left in /dev/shm (found in review)."""
    ds = _dataset(tmp_path)
    expected = list(_loader(ds, "thread"))
    before = _torch_shm()
    torch.multiprocessing.set_sharing_strategy("file_system")
    try:
        for _ in range(3):
            got = list(_loader(ds, "process"))
            assert all(_same(a, b) for a, b in zip(got, expected, strict=True))
            assert not any(_in_a_ring(b["f0"]) for b in got)
            del got
    finally:
        torch.multiprocessing.set_sharing_strategy("file_descriptor")
    gc.collect()
    assert _torch_shm() <= before


def _torch_shm() -> set[str]:
    """torch's segments in /dev/shm by name (multiprocessing's semaphores come and go)."""
    return {name for name in os.listdir("/dev/shm") if name.startswith("torch_")}


def test_a_view_kept_holds_its_own_slot_not_the_ring(tmp_path: Path) -> None:
    """One kept image an epoch pinned its worker's whole ring (8 slots): 10x the memory."""
    ds = _dataset(tmp_path)
    gc.collect()
    before = sum(_shm_mapped().values())  # other tests' segments, still held or not
    kept = []
    for _ in range(3):
        for k, batch in enumerate(_loader(ds, "process")):
            if k == 0:
                kept.append(batch["f0"][:3])
        del batch
    gc.collect()
    _ring.forget_dead()
    added = sum(_shm_mapped().values()) - before
    assert added <= 4 * 4096, added  # 3 slots of a page each (a whole ring: 9 pages)
    assert len(kept) == 3


def _shm_mapped() -> dict[str, int]:
    """This process's mappings of torch's shared-memory segments: name -> bytes."""
    sizes: dict[str, int] = {}
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) >= 6 and "/dev/shm/torch_" in parts[5]:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                sizes[parts[5]] = sizes.get(parts[5], 0) + hi - lo
    return sizes


def test_a_finalizer_run_while_this_thread_maps_a_ring_does_not_hang() -> None:
    """A garbage collection set off by an allocation under the ring's lock may end a pass (its
    forget_dead) in the same thread: the lock is reentrant (a hang, found in review)."""
    done = threading.Event()

    def nested() -> None:
        with _ring._lock:
            _ring.forget_dead()
        done.set()

    thread = threading.Thread(target=nested, daemon=True)
    thread.start()
    thread.join(10)
    assert done.is_set()


def test_a_small_dev_shm_keeps_batches_the_torch_way(tmp_path: Path, monkeypatch) -> None:
    """A ring's slots stay while the torch way frees each batch's segment: in a container's
    small /dev/shm (Docker: 64 MB) a ring takes at most an eighth of what is free, or is not
    made (the workers are forked: they see the patched room)."""
    ds = _dataset(tmp_path)
    expected = list(_loader(ds, "thread"))
    monkeypatch.setattr(_ring, "_room", lambda: 8 * 4096 * 3)  # 3 slots' worth: no ring
    got = list(_loader(ds, "process"))
    assert all(_same(a, b) for a, b in zip(got, expected, strict=True))
    assert not any(_in_a_ring(b["f0"]) for b in got)


def test_a_full_ring_without_room_for_another_is_used_again_once_freed() -> None:
    """A ring left full (batches held) with no room for a new one: its slots, freed later, are
    taken again, not given up for good."""
    saved = _ring._ring, _ring._room
    try:
        _ring._ring = None
        got = [_ring.take(1000) for _ in range(8)]
        assert all(g is not None for g in got)
        ring = got[0][0]  # type: ignore[index]
        _ring._room = lambda: 0  # no room for another ring from here on
        assert all(_ring.take(1000) is None for _ in range(2 * 8 + 1))  # full, past renewal
        ring.flags[3] = 0  # the loader's process let go of slot 3
        again = _ring.take(1000)
        assert again is not None and again[0] is ring and again[1] == 3
    finally:
        _ring._ring, _ring._room = saved


def test_large_other_values_cross_in_the_slot_beside_the_tensors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes and text of a batch (images not decoded in the workers) went through torch's
    queue: pickled twice, down a pipe, unpickled twice (0.25x a pyarrow loop over 1-8 MB rows;
    found in review). Past 64 KiB they cross in the batch's slot; what a caller holds is never
    written over, and a slot is free again once its batch's tensors are."""
    from pqloader import _pack

    rng = np.random.default_rng(0)
    rows = 600
    table = pa.table({"id": np.arange(rows), "blob": [rng.bytes(4096) for _ in range(rows)],
                      "text": [f"row {i} " * 50 for i in range(rows)]})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=100)
    ds = pqloader.ParquetDataset(tmp_path)
    expected = list(_loader(ds, "thread"))
    kinds: list[type] = []
    unpack = _pack._unpack

    def seen(flat: torch.Tensor, layout: Any, rest: Any, order: Any = None) -> Any:
        kinds.append(type(rest))
        return unpack(flat, layout, rest, order)

    monkeypatch.setattr(_pack, "_unpack", seen)
    for k, batch in enumerate(_loader(ds, "process")):  # each let go before the next
        assert batch["blob"] == expected[k]["blob"] and batch["text"] == expected[k]["text"]
        assert torch.equal(batch["id"], expected[k]["id"]) and not _in_a_ring(batch["id"])
    assert kinds == [tuple] * len(expected)  # slots freed were taken again
    kinds.clear()
    held = list(_loader(ds, "process", persistent_workers=True))  # all held
    assert [b["blob"] for b in held] == [b["blob"] for b in expected]
    assert [b["text"] for b in held] == [b["text"] for b in expected]
    assert kinds == [tuple] * len(expected)  # a batch held holds no slot: its ids are cloned


def _with_image(batch: dict[str, Any]) -> dict[str, Any]:
    batch["img"] = torch.ones(len(batch["id"]), 16_384)  # 512 KiB, under the bytes beside it
    return batch


def test_a_kept_tensor_holds_its_own_bytes_not_the_other_values_beside_it(
        tmp_path: Path) -> None:
    """With the other values in the slot, a kept image held them too: 7 MB for 1 MB (found
    in review); the README's "a view kept holds its slot alone" means its own bytes."""
    rng = np.random.default_rng(0)
    table = pa.table({"id": np.arange(64), "blob": [rng.bytes(100_000) for _ in range(64)]})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=16)
    ds = pqloader.ParquetDataset(tmp_path)
    loader = pqloader.DataLoader(ds, batch_size=8, num_workers=2, worker_type="process",
                                 transform=_with_image)
    kept = [b["img"] for b in loader]
    assert len(kept) == 8 and all(bool((t == 1).all()) for t in kept)
    assert all(t.untyped_storage().nbytes() == t.nbytes for t in kept)
