"""Batches made cheap to send from a worker process: a dict's tensors packed in one buffer."""

from __future__ import annotations

import io
import math
import pickle
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torch.utils.data

from . import _ring
from ._errors import InvalidArgumentError

_ALIGN = 64  # bytes: every packed tensor starts on a cache line
_SMALL = 8  # a tensor under 1/8 of its batch's buffer is small (cloned, if all are together)
_REST_IN_SLOT = 64 * 2**10  # bytes: the other values' pickle at least this big crosses in the
# slot beside the tensors: through torch's queue, 36 MB of image bytes were pickled again, sent
# down a pipe and unpickled twice (0.25x a pyarrow loop over such rows; found in review)


# A group of tensors of one dtype, shape and strides, side by side from byte ``offset``: their
# names, dtype, shape, strides (a dense tensor alone keeps its own: channels_last), offset.
Group = tuple[tuple[str, ...], torch.dtype, tuple[int, ...], tuple[int, ...], int]
Layout = list[Group]


def _unpack(flat: torch.Tensor, layout: Layout, rest: bytes | tuple[int, int],
            order: list[str] | None = None) -> dict[str, Any]:
    """``rest``: the other values pickled, or where in ``flat`` they lie (start, bytes)."""
    total, beside = flat.numel(), 0  # the tensors' bytes; the other values' in the slot
    if isinstance(rest, tuple):
        total, beside = rest
        batch: dict[str, Any] = pickle.loads(flat[total:total + beside].numpy().data)
    else:
        batch = pickle.loads(rest)
    sizes = [math.prod(shape) * dtype.itemsize for _, dtype, shape, _, _ in layout]
    # Small tensors beside a large one (labels beside images) get their own memory: as views,
    # keeping a batch's labels kept its images too (2,048x in review). Not when the small
    # ones are most of the batch (33 columns of W1): that would copy it all once more. A
    # tensor smaller than the other values beside it in the slot gets its own too: a kept
    # image held them (7x its bytes, found in review), and they were copied just now anyway.
    small = _SMALL * sum(size * len(names) for (names, *_), size in zip(layout, sizes, strict=True)
                         if _SMALL * size < total) < total
    for (names, dtype, shape, stride, offset), size in zip(layout, sizes, strict=True):
        group = flat[offset:offset + size * len(names)].view(dtype)
        if len(names) == 1:
            views = [group.as_strided(shape, stride)]
        else:  # one C call for the group's views: 3,000 columns a batch, one by one, took ~9 ms
            views = list(group.view(len(names), *shape).unbind(0))
            if views[0].stride() != stride:  # a size-1 dim's stride (channels_last, 1 channel)
                views = [v.as_strided(shape, stride) for v in views]
        if (small and _SMALL * size < total) or size < beside:  # each its own (a group's
            views = [v.clone() for v in views]  # memory, kept by one, held 16x its bytes)
        batch.update(zip(names, views, strict=True))
    if order is not None:  # the worker's key order (its tensors were set last here)
        batch = {k: batch[k] for k in order}
    return batch


def _unpack_slot(token: _ring.Token, slot: int, nbytes: int, layout: Layout,
                 rest: bytes | tuple[int, int], order: list[str]) -> dict[str, Any]:
    return _unpack(_ring.view(token, slot, nbytes), layout, rest, order)


def _groups(tensors: dict[str, torch.Tensor]) -> list[tuple[str, ...]]:
    """The tensors' names in groups that pack side by side and unpack as one view's rows:
    contiguous ones by dtype, shape and strides (W1's 32 float columns, a wide table's 3,000
    columns of alternating types in two groups); any other tensor alone, its strides kept."""
    groups: dict[Any, list[str]] = {}
    for name, t in tensors.items():  # (strides: contiguous ones differ where a dim is 1)
        key = (t.dtype, t.shape, t.stride()) if t.is_contiguous() else name
        groups.setdefault(key, []).append(name)
    return [tuple(names) for names in groups.values()]


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill its span of memory once each, in some order of dims."""
    if t.is_contiguous():  # most: one C call (3,000 columns a batch took 3 ms to sort)
        return t.numel() > 0
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride(), strict=True)
                               if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return t.numel() > 0


def _pickled(rest: dict[str, Any]) -> bytes:
    """The batch's other values, pickled here, in the worker: a value that does not pickle
    (a lambda, a lock, a tensor autograd would lose) fails now, with its key named, and torch
    hands the error to the caller. Left to the worker's queue, the failure was printed in the
    worker and the batch dropped: the caller waited for it forever."""
    try:
        return _dumps(rest, _Sending)
    except Exception as exc:
        key = next((k for k, v in rest.items() if not _pickles(v, _Sending)), None)
        raise TypeError(f"the batch's {key!r} cannot be sent from a worker process ({exc}); "
                        "return picklable values from transform, or use thread workers"
                        ) from exc


def _pickles(value: Any, pickler: type[pickle.Pickler]) -> bool:
    try:
        _dumps(value, pickler)
    except Exception:
        return False
    return True


def _dumps(value: Any, pickler: type[pickle.Pickler]) -> bytes:
    out = io.BytesIO()
    pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return out.getvalue()


class _Sending(pickle.Pickler):
    """Pickles as :mod:`pickle` does, but refuses what torch's process pickler would: a
    tensor that requires grad and is no leaf (plain pickle sent it as a new leaf, cut from its
    graph, where a dict held it beside a plain tensor; found in review)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and obj.requires_grad and not obj.is_leaf:
            raise TypeError(
                "a tensor that requires grad and is not a leaf (the output of a module with "
                "parameters, made outside torch.no_grad()) cannot cross to another process "
                "(autograd does not); return it .detach()ed, or make it under torch.no_grad()")
        return NotImplemented


def _packable(value: Any) -> bool:
    """Whether ``value`` is a plain tensor whose bytes alone say what it is.

    Everything else (sparse and other layouts, tensors on a device, subclasses, quantized ones,
    leaves that require grad) is left to torch's own pickling, as plain torch would send it:
    repacking them would fail (sparse has no strides) or drop what they carry (``requires_grad``).
    """
    return (type(value) is torch.Tensor and value.layout is torch.strided
            and value.is_cpu and not value.requires_grad  # (is_cpu: a third of .device's cost)
            and not value.is_quantized)


class PackedBatch:
    """A batch dict whose tensors cross a process boundary as one shared buffer.

    torch sends every tensor through its own file descriptor and socket hand-shake; for a
    33-column batch that was ~90% of the consumer's time (measured). Unpickling gives back a
    plain dict of tensors (views into the one buffer), so the receiver never sees this class.
    A dense tensor keeps its memory layout (a ``channels_last`` image batch stays one: making
    it contiguous was a transpose in the worker, 4.4 against ~2 us per 56x56x3 image, measured);
    a strided view (gaps, overlaps) arrives contiguous. Tensors :func:`_packable` rejects travel
    with the other values, each the way torch sends it. In a torch worker process, the buffer
    is a slot of the worker's ring of shared memory where one is free (``_ring.py``).
    """

    def __init__(self, batch: dict[str, Any]) -> None:
        tensors = {k: v if _dense(v) else v.contiguous()
                   for k, v in batch.items() if _packable(v)}
        rest = _pickled({k: trim(v) for k, v in batch.items() if k not in tensors})
        self.rest: bytes | tuple[int, int] = rest
        self.layout: Layout = []
        members = _groups(tensors)
        offset = 0
        for names in members:
            t = tensors[names[0]]
            self.layout.append((names, t.dtype, tuple(t.shape), tuple(t.stride()), offset))
            offset += -(-t.numel() * t.element_size() * len(names) // _ALIGN) * _ALIGN
        beside = len(rest) if len(rest) >= _REST_IN_SLOT else 0
        self.slot = _ring.take(offset + beside) \
            if torch.utils.data.get_worker_info() is not None else None
        if self.slot is not None and beside:
            self.slot[2][offset:].numpy()[:] = np.frombuffer(rest, dtype=np.uint8)
            self.rest = (offset, beside)
        self.flat = self.slot[2] if self.slot is not None else torch.empty(offset,
                                                                          dtype=torch.uint8)
        for names, dtype, shape, stride, start in self.layout:
            part = self.flat[start:start + math.prod(shape) * dtype.itemsize * len(names)] \
                .view(dtype)
            if len(names) > 1:  # one C call: numpy's stack took 1.1 ms for 1,500 vectors of
                # 32 against torch's 0.23 (each tensor's .numpy() ~0.7 us), and was no faster
                # for W1's 32 columns of 4,096 either (38 against 16 us)
                torch.stack([tensors[k] for k in names], out=part.view(len(names), *shape))
            else:
                part.as_strided(shape, stride).copy_(tensors[names[0]])
        self.order = list(batch)

    def __reduce__(self) -> tuple[Any, ...]:
        if self.slot is not None:  # (pickled once, by torch's queue: the ring's token now)
            ring, slot, flat = self.slot
            return (_unpack_slot, (ring.token(), slot, flat.numel(), self.layout, self.rest,
                                   self.order))
        return (_unpack, (self.flat, self.layout, self.rest, self.order))


def compact(batch: Any) -> Any:
    """Make a batch cheap to send to another process.

    A dict of tensors is packed into one buffer (:class:`PackedBatch`); other tensors that view
    a larger buffer (a window) are cloned, since sending a view ships its whole buffer. A list
    or tuple of tensors is compacted item by item and rebuilt as its own type (a namedtuple
    takes its items as arguments, not one iterable). What torch's process queue would refuse
    to send is refused here, where the error reaches the caller (:func:`_probe`).
    """
    if isinstance(batch, _ARROW):  # collate_fn's Arrow batch: known to pickle
        return trim(batch)
    if type(batch) is dict and any(_packable(v) for v in batch.values()):
        return PackedBatch(batch)  # (a dict subclass goes as itself, its type kept)
    if _packable(batch):
        if batch.untyped_storage().nbytes() > batch.nbytes:
            return batch.clone()
        return batch
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], torch.Tensor):
        items = [compact(v) for v in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    if type(batch) is dict:
        batch = {k: trim(v) for k, v in batch.items()}
    _probe(batch)
    return batch


class _Probe(_Sending):
    """Pickles a batch as torch's process queue will, the bytes of each tensor and array left
    out (a stand-in instead): what it refuses, torch's would refuse in its queue's thread,
    which prints the error and drops the batch, and the caller then waits for it forever
    (found in review)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _ALWAYS):  # sure to pickle: their bytes are not copied twice
            return (_nothing, ()) if not isinstance(obj, np.ndarray) or obj.dtype != object \
                else NotImplemented
        if not isinstance(obj, torch.Tensor):
            return NotImplemented
        super().reducer_override(obj)  # refuses a tensor autograd would lose
        return _nothing, ()


def _nothing() -> None:
    return None


def _probe(batch: Any) -> None:
    """Raise, naming the key or item at fault, what the batch holds that cannot be sent from a
    worker process."""
    try:
        _dumps(batch, _Probe)
    except Exception as exc:
        parts = batch.items() if isinstance(batch, Mapping) else \
            enumerate(batch) if isinstance(batch, (list, tuple)) else ()
        where = next((f" (its {k!r})" for k, v in parts if not _pickles(v, _Probe)), "")
        raise TypeError(f"the batch{where} cannot be sent from a worker process ({exc}); "
                        "return picklable values from transform, or use thread workers"
                        ) from exc


_ARROW = (pa.RecordBatch, pa.Table, pa.Array, pa.ChunkedArray)
_ALWAYS = (np.ndarray, *_ARROW)  # (numpy arrays of objects excepted)


def trim(value: Any) -> Any:
    """An Arrow value holding only its own bytes: a batch is a slice of its shuffle window,
    and pickled, a slice ships the buffers it views whole (8.6 MB for a 44 KB batch: the
    process workers ran 17x slower, found in review). Anything else as it is."""
    if not isinstance(value, _ARROW) or value.get_total_buffer_size() <= 2 * value.nbytes:
        return value
    if isinstance(value, pa.Array):
        return pa.concat_arrays([value])  # a copy of the slice alone
    if isinstance(value, pa.ChunkedArray):
        return pa.chunked_array([trim(c) for c in value.chunks], value.type)
    if isinstance(value, pa.RecordBatch):
        return pa.RecordBatch.from_arrays([trim(c) for c in value.columns], schema=value.schema)
    return pa.Table.from_batches([trim(b) for b in value.to_batches()], schema=value.schema)


def _refuse_collation(batch: Any, *, collate_fn_map: Any = None) -> Any:
    """torch's ``default_collate`` given packed batches: a ``DataLoader`` over
    ``ds.to_torch()`` not given ``batch_size=None`` collates them in its workers (torch's own
    error named this class, found in review). In the caller's process batches are plain dicts,
    collated as torch does: a dict subclass to refuse them there broke ``torch.load``, pytree
    maps and batches merged on purpose (found in review)."""
    raise InvalidArgumentError(
        "torch's DataLoader is collating the batches of ds.to_torch() (its batch_size is 1 "
        "unless given): pass it batch_size=None, since each item is already a batch of the "
        "batch_size given to to_torch()")


try:  # torch's table of collations by type (private: where it moved, collated as before)
    from torch.utils.data._utils.collate import default_collate_fn_map
except ImportError:  # pragma: no cover
    pass
else:
    default_collate_fn_map.setdefault(PackedBatch, _refuse_collation)
