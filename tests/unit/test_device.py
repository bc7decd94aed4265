"""The device placement's pure parts: walking a batch's structure, and the device argument."""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from typing import Any

import pytest
import torch

import pqloader
from pqloader._device import _moved, _pinned, flatten, resolve_device, stage, unstage

Pair = namedtuple("Pair", ["ids", "text"])


@pytest.mark.parametrize("batch", [
    {"a": torch.arange(3), "b": ["x", "y", "z"], "c": torch.ones(3, 2)},
    OrderedDict(a=torch.arange(2), nested={"b": torch.zeros(2), "n": 7}),
    (torch.arange(4), [b"a", b"b"], [torch.ones(1), torch.zeros(1)]),
    Pair(torch.arange(2), ["p", "q"]),
    [1, 2, 3],
    torch.arange(5),
    "plain",
], ids=["dict", "ordered-nested", "tuple", "namedtuple", "ints", "tensor", "str"])
def test_flatten_rebuilds_the_same_structure_around_new_tensors(batch: Any) -> None:
    leaves, rebuild = flatten(batch)
    doubled = rebuild([t * 2 for t in leaves])
    assert type(doubled) is type(batch)

    def same(a: Any, b: Any) -> None:
        if isinstance(a, torch.Tensor):
            assert torch.equal(b, a * 2)
        elif isinstance(a, dict):
            assert list(a) == list(b)
            for k in a:
                same(a[k], b[k])
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            for x, y in zip(a, b, strict=True):
                same(x, y)
        else:
            assert a == b

    same(batch, doubled)


def test_a_tuple_is_walked_whatever_comes_first() -> None:
    """("meta", t): its tensor went unpinned and stayed off the device, unseen."""
    t = torch.arange(4)
    for batch in (("meta", t), (None, t), {"x": (3, t)}):
        leaves, rebuild = flatten(batch)
        assert len(leaves) == 1 and leaves[0] is t
        assert rebuild([t + 1]) is not None


def test_lists_of_strings_are_leaves_not_walked() -> None:
    text = [f"row {i}" for i in range(1000)]
    leaves, rebuild = flatten({"id": torch.arange(1000), "text": text})
    assert len(leaves) == 1
    assert rebuild(leaves)["text"] is text


def test_device_argument() -> None:
    assert resolve_device(None) is None
    assert resolve_device("cpu") is None
    assert resolve_device(torch.device("cpu")) is None
    with pytest.raises(pqloader.InvalidArgumentError, match="not a torch device"):
        resolve_device("gpu please")
    with pytest.raises(pqloader.InvalidArgumentError, match="CUDA devices only"):
        resolve_device("meta")
    if not torch.cuda.is_available():
        for device in ("cuda", "cuda:1", 0):
            with pytest.raises(pqloader.InvalidArgumentError, match="sees no CUDA device"):
                resolve_device(device)
    else:
        assert resolve_device("cuda") == torch.device("cuda")  # the current one, at each copy
        assert resolve_device(0) == torch.device("cuda", 0)
        with pytest.raises(pqloader.InvalidArgumentError, match="CUDA device"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")


def _pageable(nbytes: int) -> torch.Tensor:
    return torch.full((nbytes,), 0xAB, dtype=torch.uint8)  # garbage where nothing is staged


def test_staging_round_trips_every_kind_of_tensor() -> None:
    """What the device copy stages and views back, checked on the host buffer itself."""
    grid = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    weights = torch.ones(4, requires_grad=True)
    batch = {
        "a": torch.arange(4, dtype=torch.float32),
        "b": torch.arange(4, 8, dtype=torch.float32),
        "label": torch.arange(4),  # int64
        "flag": torch.tensor([True, False, True, True]),  # 4 bytes: the next slab is aligned
        "half": torch.arange(4, dtype=torch.bfloat16),  # no numpy dtype: torch's copy
        "grad": weights * 2,  # requires grad: the group falls back to torch's copy, detached
        "column": grid[:, 1],  # not contiguous
        "tokens": grid.T,  # 2-D, not contiguous
        "empty": torch.empty(0, 3),
        "text": ["w", "x", "y", "z"],
    }
    leaves, rebuild = flatten(batch)
    host, layout = stage(leaves, _pageable)
    assert [s[3] % 64 for s in layout] == [0] * len(layout)  # every slab aligned
    assert len(layout) == 6  # a, b, grad and column (float32 [4]) share one slab
    back = rebuild(unstage(host, layout, leaves))
    assert back["text"] is batch["text"]
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            got = back[name]
            assert got.dtype == value.dtype and got.shape == value.shape, name
            assert torch.equal(got, value.detach()), name
            assert got.untyped_storage().data_ptr() == host.untyped_storage().data_ptr(), name
    assert not back["grad"].requires_grad


class _CustomBatch:
    """torch's custom batch type: pinned by its own pin_memory(), moved by its to()."""

    def __init__(self, where: str = "pageable") -> None:
        self.where = where

    def pin_memory(self) -> _CustomBatch:
        return _CustomBatch("pinned")

    def to(self, device: Any) -> _CustomBatch:
        return _CustomBatch(str(device))


def test_a_custom_batch_is_pinned_and_moved_by_its_own_methods() -> None:
    """torch's pin thread calls a batch's pin_memory(); pqloader's threads walked dicts, lists
    and tuples only, so a custom batch was silently left unpinned (and left on the host under
    device=; found in review)."""
    t = torch.zeros(2)
    batch = {"custom": _CustomBatch(), "x": t, "names": ["a", "b"], "n": 3, "none": None}
    leaves, rebuild = flatten(batch, _pinned)
    rebuilt = rebuild(leaves)
    assert rebuilt["custom"].where == "pinned" and rebuilt["x"] is t
    assert rebuilt["names"] == ["a", "b"] and rebuilt["n"] == 3 and rebuilt["none"] is None
    leaves, rebuild = flatten(_CustomBatch(), lambda obj: _moved(obj, torch.device("meta")))
    assert leaves == [] and rebuild([]).where == "meta"
    leaves, rebuild = flatten((t, "text", b"bytes"), _pinned)  # nothing else is asked
    assert rebuild(leaves) == (t, "text", b"bytes")
    module, storage = torch.nn.Linear(2, 2), torch.zeros(2).untyped_storage()
    others = {"cls": torch.Tensor, "module": module, "storage": storage}  # have pin_memory,
    for other in (_pinned, lambda obj: _moved(obj, torch.device("meta"))):  # not a batch's
        leaves, rebuild = flatten(others, other)
        rebuilt = rebuild(leaves)
        assert rebuilt["cls"] is torch.Tensor and rebuilt["module"] is module
        assert rebuilt["storage"] is storage and module.weight.device.type == "cpu"
