"""Where batches land: page-locked ("pinned") host memory, or a CUDA device.

A batch costs a few large operations rather than a few per tensor. The tensors of a batch that
share a dtype and a shape (W1's 32 float32 columns) are stacked into one slab and handed out as
its rows. With ``device``, every slab goes into one pinned staging buffer, which crosses to the
device in one asynchronous copy on a side stream; the caller's stream waits for it.

Measured on an H100's host (16 cores; one W1 batch: 33 tensors of 4,096 values): torch's
per-tensor ``pin_memory`` 243 µs; 33 ``non_blocking`` copies of pinned tensors 283 µs, against
13 µs for one copy of one pinned buffer. Every torch call lets go of the GIL and must take it
back, which is slow while worker threads run: a caller making 33 copies per batch fed W1 to the
device at 0.41x (pinned) and 0.53x (pageable) the rate of batches left on the host.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ._errors import InvalidArgumentError

Rebuild = Callable[[list[torch.Tensor]], Any]
_ALIGN = 64  # bytes: each group's place in a staging buffer, so that any dtype can view it


def resolve_device(device: str | int | torch.device | None) -> torch.device | None:
    """The CUDA device batches go to, or None (``None`` or a CPU device: they stay put).

    Checks what it can without opening a CUDA context."""
    if device is None:
        return None
    if isinstance(device, int) and not torch.cuda.is_available():  # torch.device(0) raises
        raise InvalidArgumentError(f"device={device!r}, but torch sees no CUDA device; pass "
                                   "device=None to keep batches on the host")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidArgumentError(f"device={device!r} is not a torch device: {exc}") from exc
    if resolved.type == "cpu":
        return None
    if resolved.type != "cuda":
        raise InvalidArgumentError(
            f"device={device!r}: pqloader copies batches to CUDA devices only; pass "
            "device=None and move them yourself"
        )
    if not torch.cuda.is_available():
        raise InvalidArgumentError(
            f"device={device!r}, but torch sees no CUDA device; pass device=None to keep "
            "batches on the host"
        )
    if resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise InvalidArgumentError(
            f"device={device!r}: torch sees {torch.cuda.device_count()} CUDA device(s)"
        )
    # No index: the current device when a batch is copied, as for tensor.to("cuda"). Asking
    # for it here would initialise CUDA in the constructor, and pin the loader to device 0 in
    # every DDP rank that makes its loader before torch.cuda.set_device(local_rank).
    return resolved


class Placement:
    """Pins batches, or copies them to ``device``; a no-op when neither is asked.

    ``finish`` runs in the thread that made the batch (a worker, or the caller): it pins.
    ``receive`` runs in the caller's thread before the caller sees the batch: it copies to
    the device. ``audited``: batches are ``(batch, rows)`` pairs (``audit_dir``); rows pass.
    """

    def __init__(self, *, pin: bool, device: torch.device | None, audited: bool) -> None:
        self.device = device
        self.pin = pin and device is None
        self._audited = audited
        self._stream: torch.cuda.Stream | None = None  # the caller's copy stream

    def finish(self, item: Any) -> Any:
        if not self.pin:
            return item
        if self._audited:
            return _pin(item[0]), item[1]
        return _pin(item)

    def receive(self, item: Any) -> Any:
        if self.device is None:
            return item
        if self._audited:
            return self._copy(item[0]), item[1]
        return self._copy(item)

    def _copy(self, batch: Any) -> Any:
        """``batch`` on the device: one pinned staging buffer, one copy on a side stream.

        Done in the caller's thread, not the workers': each torch call lets go of the GIL, and
        with several threads making such calls each waits to take it back. On an H100 host
        (16 cores, W1) the copy made in the workers fed the device at 2.3-4.0 M rows/s with 2
        to 8 threads, against 4.6-5.2 M made here (and 7 M with no worker threads at all).
        """
        assert self.device is not None
        device = self.device
        leaves, rebuild = flatten(batch, lambda obj: _moved(obj, device))
        # torch's caching allocator hands a pinned buffer out again once its copy is done
        host, layout = stage(leaves, _pinned_bytes)
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
        current = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._stream):  # overlaps the work queued on the caller's
            on_device = host.to(self.device, non_blocking=True)
        current.wait_stream(self._stream)
        on_device.record_stream(current)  # freed on the caller's stream's terms, not the copy's
        return rebuild(unstage(on_device, layout, leaves))


# a staged group: (its leaves' indices, dtype, slab shape, byte offset, bytes)
Slot = tuple[list[int], torch.dtype, tuple[int, ...], int, int]


def stage(leaves: list[torch.Tensor],
          alloc: Callable[[int], torch.Tensor]) -> tuple[torch.Tensor, list[Slot]]:
    """The host tensors of ``leaves`` written into one byte buffer from ``alloc(nbytes)``:
    each group of one dtype and shape as a slab ``[members, *shape]`` at an aligned offset."""
    layout: list[Slot] = []
    total = 0
    for (dtype, size), members in _groups(leaves).items():
        shape = (len(members), *size)
        nbytes = leaves[members[0]].element_size() * math.prod(shape)
        layout.append((members, dtype, shape, total, nbytes))
        total += -(-nbytes // _ALIGN) * _ALIGN
    host = alloc(total)
    host_bytes = host.numpy()
    for members, dtype, shape, offset, _ in layout:
        _stack_into([leaves[i] for i in members], host, host_bytes, dtype, shape, offset)
    return host, layout


def unstage(buffer: torch.Tensor, layout: list[Slot],
            leaves: list[torch.Tensor]) -> list[torch.Tensor]:
    """``leaves`` with each staged tensor replaced by its view of ``buffer`` (a copy of the
    staging buffer, wherever it is)."""
    out = list(leaves)
    for members, dtype, shape, offset, nbytes in layout:
        _scatter(out, members, buffer[offset:offset + nbytes].view(dtype).view(shape))
    return out


def _pinned_bytes(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def _groups(leaves: list[torch.Tensor]) -> dict[tuple[torch.dtype, torch.Size], list[int]]:
    """The host tensors of ``leaves`` by dtype and shape: each group goes in one slab."""
    groups: dict[tuple[torch.dtype, torch.Size], list[int]] = {}
    for i, t in enumerate(leaves):
        if t.is_cpu and t.layout is torch.strided:  # properties: a third the cost of .device
            groups.setdefault((t.dtype, t.shape), []).append(i)
    return groups


def _pin(batch: Any) -> Any:
    """``batch`` with its host tensors in pinned memory, each group stacked in one slab."""
    leaves, rebuild = flatten(batch, _pinned)
    out = list(leaves)
    for (dtype, shape), members in _groups(leaves).items():
        size = (len(members), *shape)
        slab = torch.empty(size, dtype=dtype, pin_memory=True)
        flat = slab.view(-1).view(torch.uint8)
        _stack_into([leaves[i] for i in members], flat, flat.numpy(), dtype, size, 0)
        _scatter(out, members, slab)
    return rebuild(out)


def _scatter(out: list[torch.Tensor], members: list[int], slab: torch.Tensor) -> None:
    """Hand out the rows of a group's ``slab`` as the group's tensors."""
    if len(members) == 1:
        out[members[0]] = slab[0]
    else:
        for i, row in zip(members, slab.unbind(0), strict=True):
            out[i] = row


def _stack_into(tensors: list[torch.Tensor], host: torch.Tensor, host_bytes: np.ndarray,
                dtype: torch.dtype, shape: tuple[int, ...], offset: int) -> None:
    """``torch.stack(tensors)`` written at byte ``offset`` of the pinned buffer ``host``.

    numpy copies where it can: its copy took half the time of torch's ``cat`` (H100 host, 32
    columns of 4,096 float32 into pinned memory: 134 against 271 µs).
    """
    nbytes = tensors[0].element_size() * math.prod(shape)
    np_dtype = _numpy_dtype(dtype)
    if np_dtype is not None:
        try:
            out = host_bytes[offset:offset + nbytes].view(np_dtype).reshape(shape)
            np.stack([t.numpy() for t in tensors], out=out)
            return
        except RuntimeError:  # a tensor that requires grad
            pass
    torch.stack([t.detach() for t in tensors],
                out=host[offset:offset + nbytes].view(dtype).view(shape))


@functools.cache
def _numpy_dtype(dtype: torch.dtype) -> np.dtype[Any] | None:
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError:  # none in numpy (bfloat16, the float8 types)
        return None


def flatten(batch: Any, other: Callable[[Any], Any] | None = None,
            ) -> tuple[list[torch.Tensor], Rebuild]:
    """The tensors in ``batch`` (through dicts, lists and tuples), and a function that builds
    the same structure around new tensors, and around ``other(obj)`` for each other object
    (else the object). A tuple is always walked (``("meta", t)`` lost its tensor); a list
    only when its first item is a tensor or a container: lists of str, bytes or numbers are
    leaves."""
    leaves: list[torch.Tensor] = []
    build = _flatten(batch, leaves, other)
    return leaves, lambda new: build(iter(new))


def _pinned(obj: Any) -> Any:
    """An object of the user's own kind pinned as torch's pin thread does: by its method."""
    return obj.pin_memory() if _custom(obj) else obj


def _moved(obj: Any, device: torch.device) -> Any:
    """An object of the user's own kind moved by its ``to`` (a custom batch's habit: one
    with ``pin_memory`` too; a module in a batch is left where it is, not moved in place)."""
    return obj.to(device) if _custom(obj) and callable(getattr(obj, "to", None)) else obj


def _custom(obj: Any) -> bool:
    """Whether ``obj`` is a custom batch type's instance, as torch's pin thread takes one: a
    ``pin_memory`` method (not a class, a storage or a module, which have one too)."""
    return callable(getattr(obj, "pin_memory", None)) and not isinstance(
        obj, (type, torch.UntypedStorage, torch.TypedStorage, torch.nn.Module))


def _flatten(obj: Any, leaves: list[torch.Tensor],
             other: Callable[[Any], Any] | None = None) -> Callable[[Any], Any]:
    if isinstance(obj, torch.Tensor):
        leaves.append(obj)
        return next
    if isinstance(obj, Mapping):
        parts = {k: _flatten(v, leaves, other) for k, v in obj.items()}
        kind = type(obj)

        def mapping(it: Any) -> Any:
            values = {k: part(it) for k, part in parts.items()}
            return values if kind is dict else _same_kind(kind, values)

        return mapping
    if isinstance(obj, tuple) or (isinstance(obj, list) and obj and \
            isinstance(obj[0], (torch.Tensor, Mapping, list, tuple))):
        items = [_flatten(v, leaves, other) for v in obj]
        kind_s = type(obj)

        def sequence(it: Any) -> Any:
            values = [part(it) for part in items]
            if hasattr(obj, "_fields"):  # a namedtuple
                return kind_s(*values)
            return values if kind_s is list else _same_kind(kind_s, values)

        return sequence
    done = obj if other is None else other(obj)
    return lambda _it: done


def _same_kind(kind: type, values: Mapping[Any, Any] | Sequence[Any]) -> Any:
    try:
        return kind(values)
    except TypeError:  # a type that cannot be built from its items: a plain dict or list
        return dict(values) if isinstance(values, Mapping) else list(values)
