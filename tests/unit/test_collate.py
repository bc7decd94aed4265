"""Arrow columns to tensors (``fixed_size_list`` nulls), and batches across a process boundary."""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import pqloader
from pqloader._collate import PackedBatch, prepare, to_torch, window_order


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
