"""``pin_memory`` on a real CUDA device: pinned batches, equal to unpinned ones, in every mode.

The device tests skip where there is no CUDA device (CI has none); the fallback's warning is
tested everywhere.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
import torch
import torch.utils.data

import pqloader

ROWS = 1000
BATCH = 64
MODES = [
    pytest.param({"num_workers": 0}, id="inline"),
    pytest.param({"num_workers": 2}, id="threads"),
    pytest.param({"num_workers": 2, "worker_type": "process"}, id="processes"),
    pytest.param({"num_workers": "auto"}, id="auto"),
]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture
def ds(make_dataset: Any) -> pqloader.ParquetDataset:
    return pqloader.ParquetDataset(make_dataset(ROWS))


def _same(plain: dict[str, Any], pinned: dict[str, Any]) -> None:
    """``pinned`` holds ``plain``'s values, every tensor of it in page-locked memory."""
    assert plain.keys() == pinned.keys()
    for name, value in plain.items():
        if isinstance(value, torch.Tensor):
            assert pinned[name].is_pinned(), name
            assert torch.equal(value, pinned[name]), name
        else:
            assert value == pinned[name], name


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback without CUDA")
def test_pin_memory_without_cuda_warns_and_delivers(ds: pqloader.ParquetDataset) -> None:
    with pytest.warns(UserWarning, match="no CUDA device"):
        loader = pqloader.DataLoader(ds, batch_size=BATCH, pin_memory=True)
    batches = list(loader)
    assert sum(len(b["id"]) for b in batches) == ROWS
    assert not any(b["id"].is_pinned() for b in batches)


@cuda
@pytest.mark.parametrize("mode", MODES)
def test_pinned_batches_equal_unpinned_and_reach_the_device(ds: pqloader.ParquetDataset,
                                                            mode: dict[str, Any]) -> None:
    def loader(pin: bool) -> pqloader.DataLoader:
        return pqloader.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=4, pin_memory=pin,
                                   **mode)

    plain, pinned = list(loader(False)), list(loader(True))
    assert len(plain) == len(pinned) == len(loader(True))
    for a, b in zip(plain, pinned, strict=True):
        _same(a, b)
        # the use pinning is for: an asynchronous copy that overlaps the next batch's work
        on_device = {k: v.to("cuda", non_blocking=True) for k, v in b.items()
                     if isinstance(v, torch.Tensor)}
        torch.cuda.synchronize()
        for name, tensor in on_device.items():
            assert tensor.is_cuda and torch.equal(tensor.cpu(), a[name]), name
    assert sorted(i for b in pinned for i in b["id"].tolist()) == list(range(ROWS))


def _as_tuple(batch: pa.RecordBatch) -> tuple[torch.Tensor, list[str]]:
    return torch.from_numpy(batch.column("id").to_numpy()), batch.column("text").to_pylist()


@cuda
@pytest.mark.parametrize("mode", MODES[:3])
def test_pin_memory_pins_what_collate_fn_returns(ds: pqloader.ParquetDataset,
                                                 mode: dict[str, Any]) -> None:
    loader = pqloader.DataLoader(ds, batch_size=BATCH, collate_fn=_as_tuple, pin_memory=True,
                                 **mode)
    out = list(loader)
    assert all(ids.is_pinned() for ids, _ in out)
    assert all(text == [f"row {i}" for i in ids.tolist()] for ids, text in out)
    assert sorted(i for ids, _ in out for i in ids.tolist()) == list(range(ROWS))


@cuda
def test_to_torch_under_torchs_pinning_loader(ds: pqloader.ParquetDataset) -> None:
    it = ds.to_torch(batch_size=BATCH, shuffle=True, seed=1)
    loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2, pin_memory=True)
    batches = list(loader)
    assert all(b["x"].is_pinned() and b["tokens"].is_pinned() for b in batches)
    assert sorted(i for b in batches for i in b["id"].tolist()) == list(range(ROWS))


def test_device_cpu_keeps_batches_on_the_host(ds: pqloader.ParquetDataset) -> None:
    plain = list(pqloader.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=2))
    host = list(pqloader.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=2, device="cpu"))
    for a, b in zip(plain, host, strict=True):
        assert all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
                   for k in a)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_device_cuda_without_cuda_is_a_clear_error(ds: pqloader.ParquetDataset) -> None:
    with pytest.raises(pqloader.InvalidArgumentError, match=r"device='cuda'.*no CUDA device"):
        pqloader.DataLoader(ds, batch_size=BATCH, device="cuda")


def _check_on_device(host: dict[str, Any], on_device: dict[str, Any]) -> None:
    assert host.keys() == on_device.keys()
    for name, value in host.items():
        if isinstance(value, torch.Tensor):
            assert on_device[name].is_cuda, name
            assert torch.equal(on_device[name].cpu(), value), name
        else:
            assert on_device[name] == value, name


@cuda
@pytest.mark.parametrize("mode", MODES)
def test_device_batches_arrive_on_the_device_equal_to_host_batches(
        ds: pqloader.ParquetDataset, mode: dict[str, Any], tmp_path: Any) -> None:
    def loader(**kw: Any) -> pqloader.DataLoader:
        return pqloader.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=6, **mode, **kw)

    host = list(loader())
    # the caller's stream keeps busy while batches arrive: the copies must still be waited for
    busy = torch.randn(2048, 2048, device="cuda")
    arrived = []
    for batch in loader(device="cuda", audit_dir=tmp_path / "audit"):
        busy = busy @ busy / 2048
        arrived.append({k: v.clone() if isinstance(v, torch.Tensor) else v
                        for k, v in batch.items()})
    assert len(arrived) == len(host)
    for a, b in zip(host, arrived, strict=True):
        _check_on_device(a, b)
    (report,) = pqloader.audit(tmp_path / "audit")
    assert report.exactly_once, report


@cuda
def test_a_batch_crosses_in_one_copy_and_pins_in_one_slab_per_group(
        ds: pqloader.ParquetDataset) -> None:
    def storages(batch: dict[str, Any]) -> dict[str, int]:
        return {k: v.untyped_storage().data_ptr() for k, v in batch.items()
                if isinstance(v, torch.Tensor)}

    on_device = storages(next(iter(pqloader.DataLoader(ds, batch_size=BATCH, device="cuda"))))
    assert len(set(on_device.values())) == 1  # one buffer on the device: one copy
    pinned = storages(next(iter(pqloader.DataLoader(ds, batch_size=BATCH, pin_memory=True))))
    # id and tokens_lengths are both int64 [B]: one slab; the others each their own
    assert pinned["id"] == pinned["tokens_lengths"]
    assert len({pinned["id"], pinned["x"], pinned["tokens"]}) == 3


@cuda
def test_device_moves_what_collate_fn_returns(ds: pqloader.ParquetDataset) -> None:
    loader = pqloader.DataLoader(ds, batch_size=BATCH, collate_fn=_as_tuple, device="cuda",
                                 num_workers=2)
    out = list(loader)
    assert all(ids.is_cuda for ids, _ in out)
    assert all(text == [f"row {i}" for i in ids.tolist()] for ids, text in out)
    assert sorted(i for ids, _ in out for i in ids.tolist()) == list(range(ROWS))


@cuda
def test_bench_waits_for_the_last_copy(ds: pqloader.ParquetDataset) -> None:
    from pqloader._bench import bench

    result = bench(ds, batch_size=BATCH, device="cuda", num_workers=2, progress=False)
    assert result.rows == ROWS and result.rows_per_s > 0
