"""Batches across a process boundary (``_collate.PackedBatch``): values and layouts kept."""

from __future__ import annotations

import pickle

import torch

from pqloader._collate import PackedBatch


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
