"""Arrow columns to tensors (``fixed_size_list`` nulls), and batches across a process boundary."""

from __future__ import annotations

import math
import pickle
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import pqloader
from pqloader._collate import prepare, to_torch, window_order
from pqloader._pack import PackedBatch, compact


def test_packed_batch_keeps_values_dtypes_and_dense_layouts() -> None:
    image = torch.arange(4 * 3 * 5 * 6, dtype=torch.uint8).reshape(4, 3, 5, 6)
    batch = {
        "image": image.contiguous(memory_format=torch.channels_last),
        "x": torch.rand(4),
        "label": torch.arange(4),
        "strided": torch.arange(40.0).reshape(4, 10)[:, ::2],  # gaps: arrives contiguous
        "names": ["a", "b", "c", "d"],
    }
    got = pickle.loads(pickle.dumps(PackedBatch(batch)))
    assert got.keys() == batch.keys() and got["names"] == batch["names"]
    for name in ("image", "x", "label", "strided"):
        assert got[name].dtype == batch[name].dtype and torch.equal(got[name], batch[name])
    assert got["image"].is_contiguous(memory_format=torch.channels_last)
    assert got["image"].stride() == batch["image"].stride()
    assert got["strided"].is_contiguous()


def test_packed_groups_of_one_dtype_and_shape_come_back_as_they_went() -> None:
    """Contiguous tensors of one dtype and shape are packed side by side and unpacked as one
    view's rows, wherever they lie in the batch (a wide table's columns of alternating types:
    two groups, not one copy and one view each); an odd size, a 2-D tensor, an empty one, a
    single value or a strided one keep their own values, shapes and order."""
    batch = {"a": torch.rand(16), "b": torch.rand(16), "odd": torch.rand(5), "c": torch.rand(16),
             "i": torch.arange(16), "j": torch.arange(16, 32), "m": torch.rand(4, 4),
             "e": torch.rand(0), "one": torch.tensor([7.0]), "d": torch.rand(16),
             "s": torch.arange(10.0)[::3], "m2": torch.rand(4, 4), "odd2": torch.rand(5),
             "bf": torch.rand(16).to(torch.bfloat16), "bf2": torch.rand(16).to(torch.bfloat16)}
    got = pickle.loads(pickle.dumps(PackedBatch(batch)))
    assert list(got) == list(batch)
    for name, value in batch.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        assert torch.equal(got[name], value), name
    one_channel = torch.rand(4, 1, 8, 8).to(memory_format=torch.channels_last)
    pooled = torch.rand(4, 16, 1, 1).to(memory_format=torch.channels_last)
    column = torch.rand(1, 4).t()
    strided = {"img": one_channel, "mask": one_channel.clone(), "f": pooled,
               "g": pooled.clone(), "t": column, "u": column.clone(),
               "plain": torch.rand(4, 1, 8, 8), "plain2": torch.rand(4, 1, 8, 8)}
    got = pickle.loads(pickle.dumps(PackedBatch(strided)))  # size-1 dims' strides kept too
    for name, value in strided.items():  # (a conv of a 1-channel image gave channels_first)
        assert got[name].stride() == value.stride() and torch.equal(got[name], value), name
    wide = {f"f{j}": torch.arange(j, j + 32, dtype=torch.float32 if j % 2 else torch.int64)
            for j in range(300)}
    packed = PackedBatch(wide)
    assert [len(names) for names, *_ in packed.layout] == [150, 150]
    got = pickle.loads(pickle.dumps(packed))
    assert list(got) == list(wide)
    assert all(torch.equal(got[k], v) and got[k].dtype == v.dtype for k, v in wide.items())


class XY(NamedTuple):  # module level: pickle finds it by name
    x: torch.Tensor
    y: torch.Tensor


def _sent(batch: Any) -> Any:
    """``batch`` as a worker process sends it and the loader's process receives it."""
    return pickle.loads(pickle.dumps(compact(batch)))


def test_compact_rebuilds_sequences_as_their_own_type() -> None:
    x, y = torch.arange(4.0), torch.arange(8).reshape(4, 2)[:, 0]  # y views a larger buffer
    got = _sent(XY(x, y))
    assert type(got) is XY and torch.equal(got.x, x) and torch.equal(got.y, y)
    assert got.y.untyped_storage().nbytes() == got.y.nbytes  # the view was cut out, not shipped
    for kind in (list, tuple):
        items = _sent(kind([x, y]))
        assert type(items) is kind and all(map(torch.equal, items, [x, y]))


@pytest.mark.filterwarnings("ignore:Sparse")  # CSR is beta; sparse invariants unchecked
def test_compact_leaves_sparse_and_grad_tensors_to_torch() -> None:
    dense = torch.arange(6.0).reshape(2, 3)
    leaf = torch.rand(3).requires_grad_()
    batch = {"sparse": dense.to_sparse(), "csr": dense.to_sparse_csr(), "grad": leaf,
             "x": dense, "names": ["a", "b"]}
    packed = compact(batch)
    assert isinstance(packed, PackedBatch) and [n for n, *_ in packed.layout] == [("x",)]
    got = pickle.loads(pickle.dumps(packed))
    assert got.keys() == batch.keys() and got["names"] == ["a", "b"]
    assert got["sparse"].layout == torch.sparse_coo and torch.equal(got["sparse"].to_dense(), dense)
    assert got["csr"].layout == torch.sparse_csr and torch.equal(got["csr"].to_dense(), dense)
    assert got["grad"].requires_grad and torch.equal(got["grad"].detach(), leaf.detach())
    assert torch.equal(got["x"], dense)
    sparse = _sent(dense.to_sparse())  # a batch that is one sparse tensor
    assert sparse.is_sparse and torch.equal(sparse.to_dense(), dense)
    assert isinstance(compact({"sparse": dense.to_sparse()}), dict)  # nothing to pack


def _as_xy(batch: dict[str, Any]) -> XY:
    return XY(batch["id"], batch["id"] * 2)


def _as_sparse(batch: dict[str, Any]) -> dict[str, Any]:
    return {"id": batch["id"], "s": batch["id"].float().unsqueeze(1).to_sparse()}


@pytest.mark.filterwarnings("ignore:Sparse")
@pytest.mark.parametrize("transform", [_as_xy, _as_sparse], ids=["namedtuple", "sparse"])
def test_transforms_through_a_worker_process(tmp_path: Path, transform: Any) -> None:
    pq.write_table(pa.table({"id": np.arange(8, dtype=np.int64)}), tmp_path / "a.parquet")
    ds = pqloader.ParquetDataset(tmp_path)
    started = time.perf_counter()
    loader = torch.utils.data.DataLoader(ds.to_torch(batch_size=4, shuffle=False,
                                                     transform=transform),
                                         batch_size=None, num_workers=1)
    got = list(loader)
    assert time.perf_counter() - started < 5
    assert len(got) == 2
    if transform is _as_xy:
        assert all(type(b) is XY for b in got)
        assert torch.equal(torch.cat([b.x for b in got]), torch.arange(8))
    else:
        assert all(b["s"].is_sparse for b in got)
        assert torch.equal(torch.cat([b["s"].to_dense() for b in got]).squeeze(1),
                           torch.arange(8.0))


def _with_lock(batch: dict[str, Any]) -> Any:
    return ("ids", threading.Lock())  # no tensor at all, and a value that does not pickle


def _as_tuple(batch: dict[str, Any]) -> Any:
    return batch["id"], batch["id"].numpy()  # torch's default_convert made a list of tensors


def test_a_batch_that_does_not_pickle_is_an_error_not_a_hang(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": np.arange(8, dtype=np.int64)}), tmp_path / "a.parquet")
    loader = pqloader.DataLoader(pqloader.ParquetDataset(tmp_path), batch_size=4,
                                 transform=_with_lock, num_workers=1, worker_type="process",
                                 timeout=60)
    with pytest.raises(TypeError, match="cannot be sent from a worker process"):
        list(loader)


def test_process_workers_deliver_batches_as_threads_do(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": np.arange(8, dtype=np.int64), "s": [str(i) for i in
                                                                        range(8)]}),
                   tmp_path / "a.parquet")
    ds = pqloader.ParquetDataset(tmp_path, columns=["s", "id"])
    for transform in (None, _as_tuple):
        batches = [list(pqloader.DataLoader(ds, batch_size=4, transform=transform,
                                            num_workers=1, worker_type=kind))
                   for kind in ("thread", "process")]
        for a, b in zip(*batches, strict=True):
            assert type(a) is type(b)
            if isinstance(a, dict):
                assert list(a) == list(b) == ["s", "id"]  # the keys in the dataset's order
            else:
                assert [type(v) for v in a] == [type(v) for v in b]  # numpy stays numpy


def _arrow_as_is(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch


def _arrow_in_a_dict(batch: pa.RecordBatch) -> dict[str, Any]:
    return {"id": torch.from_numpy(batch.column("id").to_numpy()), "s": batch.column("s")}


def test_arrow_batches_from_worker_processes_carry_their_own_rows_only(tmp_path: Path) -> None:
    """collate_fn's Arrow batch is a slice of its shuffle window: pickled, it shipped the whole
    window (8.6 MB for a 44 KB batch; the epoch ran 17x slower than from thread workers)."""
    n = 100_000
    pq.write_table(pa.table({"id": np.arange(n), "s": [f"text of row {i}" for i in range(n)]}),
                   tmp_path / "a.parquet", row_group_size=25_000)
    ds = pqloader.ParquetDataset(tmp_path)
    for collate in (_arrow_as_is, _arrow_in_a_dict):
        loader = pqloader.DataLoader(ds, batch_size=1000, shuffle=True, collate_fn=collate,
                                     num_workers=1, worker_type="process")
        ids = []
        for batch in loader:
            arrow = batch if isinstance(batch, pa.RecordBatch) else batch["s"]
            assert arrow.get_total_buffer_size() <= 2 * arrow.nbytes
            if isinstance(batch, dict):
                ids += batch["id"].tolist()
                assert batch["s"].to_pylist() == [f"text of row {i}" for i in ids[-1000:]]
            else:
                ids += batch.column("id").to_pylist()
        assert sorted(ids) == list(range(n))


def test_small_tensors_from_worker_processes_do_not_hold_their_batch(tmp_path: Path) -> None:
    """Labels kept from batches of images held every image (one buffer a batch, 2,048x their
    size); many columns of one size (W1's 33) still share it: no second copy of the batch."""
    n = 256
    images = pa.FixedSizeListArray.from_arrays(pa.array(np.ones(n * 4096, np.uint8)), 4096)
    pq.write_table(pa.table({"image": images, "label": np.arange(n)}), tmp_path / "img.parquet")
    pq.write_table(pa.table({f"f{i}": np.ones(n, np.float32) for i in range(16)}),
                   tmp_path / "w1.parquet")
    (batch,) = pqloader.DataLoader(pqloader.ParquetDataset(tmp_path / "img.parquet"),
                                   batch_size=n, num_workers=1, worker_type="process")
    assert batch["label"].untyped_storage().nbytes() == batch["label"].nbytes
    assert batch["label"].tolist() == list(range(n)) and int(batch["image"].sum()) == n * 4096
    (batch,) = pqloader.DataLoader(pqloader.ParquetDataset(tmp_path / "w1.parquet"),
                                   batch_size=n, num_workers=1, worker_type="process")
    assert batch["f0"].untyped_storage().nbytes() > 8 * batch["f0"].nbytes  # one buffer
    (batch,) = pqloader.DataLoader(pqloader.ParquetDataset(tmp_path / "img.parquet"),
                                   batch_size=n, num_workers=1, worker_type="process",
                                   transform=_embeddings)
    for k in range(16):  # small ones of one shape: each its own (not their group's 16x)
        assert batch[f"emb{k}"].untyped_storage().nbytes() == batch[f"emb{k}"].nbytes
        assert torch.equal(batch[f"emb{k}"], torch.full((n, 4), float(k)))


def _embeddings(batch: dict[str, Any]) -> dict[str, Any]:
    return batch | {f"emb{k}": torch.full((len(batch["label"]), 4), float(k))
                    for k in range(16)}


def test_a_column_named_like_a_list_columns_lengths_is_refused(tmp_path: Path) -> None:
    pq.write_table(pa.table({"tok": [[1, 2], [3]], "tok_lengths": [7, 8]}),
                   tmp_path / "a.parquet")
    with pytest.raises(pqloader.InvalidArgumentError, match="'tok_lengths' has the name of the "
                       "lengths that list column 'tok'"):
        pqloader.DataLoader(pqloader.ParquetDataset(tmp_path), batch_size=2)


# -- fixed_size_list columns ----------------------------------------------------------------------
def _fixed(rows: list[Any], value_type: pa.DataType, size: int = 2) -> pa.ChunkedArray:
    return pa.chunked_array([pa.array(rows, pa.list_(value_type, size))])


def _batch(column: pa.ChunkedArray, order: list[int] | None = None) -> torch.Tensor:
    take = None if order is None else window_order(np.array(order))
    tensor: torch.Tensor = to_torch({"emb": prepare(column, "emb", "fixed_list", take)},
                                    {"emb": "fixed_list"})["emb"]
    return tensor


@pytest.mark.parametrize("rows", [[[1, 2], [3, None]], [[1, 2], None]], ids=["value", "list"])
@pytest.mark.parametrize("value_type", [pa.int32(), pa.int64(), pa.bool_()])
def test_fixed_size_list_nulls_of_integers_are_a_data_error(rows: list[Any],
                                                           value_type: pa.DataType) -> None:
    if value_type == pa.bool_():
        rows = [[bool(v) if v is not None else None for v in r] if r else r for r in rows]
    with pytest.raises(pqloader.DataError, match=r"column 'emb'.*null.*collate_fn="):
        _batch(_fixed(rows, value_type))


def test_fixed_size_list_float_nulls_become_nan() -> None:
    column = _fixed([[1.0, None], None, [3.0, 4.0]], pa.float32())
    got = _batch(column)
    assert got.dtype == torch.float32 and got.shape == (3, 2)
    expected = torch.tensor([[1.0, math.nan], [math.nan, math.nan], [3.0, 4.0]])
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.nan_to_num(-1), expected.nan_to_num(-1))


def test_fixed_size_list_batches_respect_offsets_and_order() -> None:
    values = [[i, 10 * i] for i in range(6)]
    chunks = pa.chunked_array([pa.array(values[:4], pa.list_(pa.int32(), 2)).slice(1),  # offset
                               pa.array(values[4:], pa.list_(pa.int32(), 2))])
    window = prepare(chunks, "emb", "fixed_list", None)
    got = to_torch({"emb": window.slice(2, 3)}, {"emb": "fixed_list"})["emb"]  # a batch: a slice
    assert got.dtype == torch.int32 and got.tolist() == values[3:6]
    assert _batch(chunks, [4, 0, 2]).tolist() == [values[5], values[1], values[3]]


def test_fixed_size_list_int_nulls_through_the_loader(tmp_path: Path) -> None:
    pq.write_table(pa.table({"emb": pa.array([[1, 2], [3, None]], pa.list_(pa.int32(), 2))}),
                   tmp_path / "a.parquet")
    ds = pqloader.ParquetDataset(tmp_path)
    with pytest.raises(pqloader.DataError, match="'emb'"):
        next(iter(pqloader.DataLoader(ds, batch_size=2, num_workers=0)))


@pytest.mark.parametrize("value_type", [pa.int64(), pa.bool_(), pa.float32()])
def test_a_list_column_sliced_keeps_its_type_whatever_lies_outside_the_slice(
        value_type: pa.DataType) -> None:
    """A window is a slice of its row groups: a null value inside a list of rows outside it
    (another rank's) made an int column float64, and a bool one fail in torch."""
    rows = [[1, 0], [1], None, [0, 1, 1], [1, None]]
    if value_type == pa.bool_():
        rows = [r and [None if v is None else bool(v) for v in r] for r in rows]
    column = pa.chunked_array([pa.array(rows, pa.list_(value_type)).slice(1, 3)])
    got = to_torch({"v": prepare(column, "v", "list", None)}, {"v": "list"})
    assert got["v"].dtype == torch.from_numpy(np.zeros(0, value_type.to_pandas_dtype())).dtype
    assert got["v"].tolist() == [[1, 0, 0], [0, 0, 0], [0, 1, 1]]
    assert got["v_lengths"].tolist() == [1, 0, 3]
    order = window_order(np.array([2, 0]))
    got = to_torch({"v": prepare(column, "v", "list", order)}, {"v": "list"})
    assert got["v"].tolist() == [[0, 1, 1], [1, 0, 0]]


def test_ranks_of_one_row_group_get_the_same_list_dtype(tmp_path: Path) -> None:
    rows = [[i, i + 1] for i in range(9)] + [[9, None]]  # a null in rank 1's rows only
    pq.write_table(pa.table({"id": range(10), "v": pa.array(rows, pa.list_(pa.int64()))}),
                   tmp_path / "a.parquet")
    ds = pqloader.ParquetDataset(tmp_path)
    batch = next(iter(pqloader.DataLoader(ds, batch_size=5, rank=0, world_size=2)))
    assert batch["v"].dtype == torch.int64
    assert batch["v"].tolist() == [[i, i + 1] for i in batch["id"].tolist()]
    with pytest.raises(pqloader.DataError, match=r"'v'.*null values inside"):
        next(iter(pqloader.DataLoader(ds, batch_size=5, rank=1, world_size=2)))


def test_unsigned_columns_come_as_signed_tensors_torch_can_use(tmp_path: Path) -> None:
    """uint16 token ids, uint32 labels: torch's uint16/32/64 tensors have no +, max, loss
    target or embedding lookup. They come as the next signed type, values kept."""
    table = pa.table({
        "label": pa.array([1, 2, 2**32 - 1], pa.uint32()),
        "big": pa.array([0, 2**63 - 1, 5], pa.uint64()),
        "small": pa.array([0, 255, 7], pa.uint8()),  # torch's uint8 is a full type: kept
        "tokens": pa.array([[5, 65535], [7], []], pa.list_(pa.uint16())),
        "pair": pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.uint32(), 2)),
    })
    pq.write_table(table, tmp_path / "a.parquet")
    (batch,) = pqloader.DataLoader(pqloader.ParquetDataset(tmp_path), batch_size=3)
    assert {k: v.dtype for k, v in batch.items()} == {
        "label": torch.int64, "big": torch.int64, "small": torch.uint8, "tokens": torch.int32,
        "tokens_lengths": torch.int64, "pair": torch.int64}
    assert batch["label"].tolist() == [1, 2, 2**32 - 1]
    assert batch["big"].tolist() == [0, 2**63 - 1, 5]
    assert batch["tokens"].tolist() == [[5, 65535], [7, 0], [0, 0]]
    assert int(batch["label"].max()) == 2**32 - 1 and batch["pair"].sum() == 21
    assert torch.nn.Embedding(65536, 2)(batch["tokens"]).shape == (3, 2, 2)
    pq.write_table(pa.table({"big": pa.array([2**64 - 1], pa.uint64())}), tmp_path / "b.parquet")
    with pytest.raises(pqloader.DataError, match=r"column 'big' has uint64 values past"):
        list(pqloader.DataLoader(pqloader.ParquetDataset(tmp_path / "b.parquet"), batch_size=1))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("column", ["big", "tokens", "pair"])
def test_uint64_past_int64_names_its_row_group_and_value(tmp_path: Path, column: str,
                                                         shuffle: bool) -> None:
    """The error named every row group of the window (a file's, or several files'), and no
    value; a fixed-size list's failed with pyarrow's 'Could not convert' instead."""
    big = 2**64 - 1
    pq.write_table(pa.table({
        "id": np.arange(30),
        "big": pa.array([2**63 + 1 if i == 17 else i for i in range(30)], pa.uint64()),
        "tokens": pa.array([[1, big] if i == 22 else [i] for i in range(30)],
                           pa.list_(pa.uint64())),
        "pair": pa.array([[1, big] if i == 2 else [i, 0] for i in range(30)],
                         pa.list_(pa.uint64(), 2)),
    }), tmp_path / "a.parquet", row_group_size=5)
    ds = pqloader.ParquetDataset(tmp_path, columns=["id", column])
    with pytest.raises(pqloader.DataError, match=f"column '{column}' has uint64 values past "
                       r"int64's range \(up to [0-9,]+\).*leave it out with columns=") as info:
        list(pqloader.DataLoader(ds, batch_size=30, shuffle=shuffle))
    group = {"big": 3, "tokens": 4, "pair": 0}[column]
    assert f"in {tmp_path / 'a.parquet'}: row group {group}" in info.value.__notes__


class _NoPickle(np.ndarray):
    def __reduce__(self) -> Any:
        raise AssertionError("pickled: its bytes would be copied twice")


def test_the_probe_leaves_out_the_bytes_of_arrays_sure_to_pickle() -> None:
    """Probing a batch of numpy images (38 MB) pickled them once more before torch's queue
    did: 17.6 ms a batch in each worker (found in review). Arrays of objects are probed."""
    images = np.zeros((4, 8), dtype=np.uint8).view(_NoPickle)
    batch = (images, torch.arange(4), pa.array([1, 2]))
    assert compact(batch) is batch
    with pytest.raises(TypeError, match="cannot be sent from a worker process"):
        compact((np.array([threading.Lock()], dtype=object), torch.arange(4)))


def test_a_run_of_list_rows_is_gathered_as_a_view_and_right_around_null_lists() -> None:
    """Rows in read order were gathered value by value, and a batch joined across windows
    gathered twice (a batch of 65,536 token lists at 0.25x the floor, found in review): a
    run's values are a view now, unless a null list's offsets span values (Arrow allows it)."""
    from pqloader._collate import Ragged

    offsets = pa.array([0, 2, 5, 7, 9], pa.int32())
    values = pa.array(np.arange(9, dtype=np.int32))
    plain = Ragged.of(pa.ListArray.from_arrays(offsets, values), None, "t")
    flat, lengths = plain.slice(1, 2).gather()
    assert flat.tolist() == [2, 3, 4, 5, 6] and lengths.tolist() == [3, 2]
    assert np.shares_memory(flat, plain.values)
    nulled = pa.ListArray.from_arrays(offsets, values, mask=pa.array([False, True, False, False]))
    flat, lengths = Ragged.of(nulled, None, "t").slice(0, 3).gather()
    assert flat.tolist() == [0, 1, 5, 6] and lengths.tolist() == [2, 0, 2]


def test_a_list_batch_across_reads_is_padded_part_by_part() -> None:
    """A batch of several windows' rows (one in read order, one permuted, of other widths) is
    padded from each part in place, the parts' values never joined first."""
    from pqloader._collate import Ragged, _padded

    first = pa.array([[1, 2], [3], [4, 5, 6]], pa.list_(pa.int32()))
    second = pa.array([[7], [], [8, 9, 10, 11]], pa.list_(pa.int32()))
    parts = [Ragged.of(first, None, "t").slice(1, 2),
             Ragged.of(second, np.array([2, 0, 1]), "t")]
    batch = _padded(Ragged.concat(parts), "t")
    assert batch["t"].tolist() == [[3, 0, 0, 0], [4, 5, 6, 0], [8, 9, 10, 11], [7, 0, 0, 0],
                                   [0, 0, 0, 0]]
    assert batch["t_lengths"].tolist() == [1, 3, 4, 1, 0]
