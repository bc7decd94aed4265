"""Batches from a worker process through slots of shared memory it reuses.

Sent the torch way, each batch is a new shared-memory segment: created, faulted in page by page
and filled by the worker, its file descriptor passed over a socket to the loader's process,
mapped there, and unmapped by both. For a 540 KB batch (W1) creating and faulting the segment
took 400 of the worker's ~480 us, against 80 us to fill one made before (measured), and the
loader's process spent ~490 us of CPU receiving each.

Here a worker process makes one *ring* of ``SLOTS`` slots once, and sends its segment (the torch
way) until the loader's process says it has it. A batch is written into a free slot, and only
its slot number crosses with the pickled rest. The loader's process hands out views of the slot
(no copy) and marks the slot free once the last of them is gone (a finalizer). A slot the
consumer still holds is not free, so nothing it holds is overwritten: with every slot held, or a
batch too large for the ring, the batch goes the torch way, as before.

One byte per slot, in the ring's header, says whose it is: the worker sets it taken before it
writes, the loader's process clears it when the views are gone. The header's last byte says the
loader's process has mapped the ring (the worker stops sending it).
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from dataclasses import dataclass

import numpy as np
import torch

SLOTS = 8  # per worker: torch's prefetch_factor (2) in flight, the caller's, a pinning thread's
_HEADER = 64  # bytes: a flag per slot, the ring's "mapped" flag last
_MAPPED = _HEADER - 1
_MOST_BYTES = 256 * 2**20  # a ring's size at most: a larger batch goes the torch way
_FREE, _TAKEN = 0, 1


@dataclass(frozen=True)
class Token:
    """A ring, as a message names it: its worker's pid and number, with its segment while the
    loader's process may not have it yet."""

    pid: int
    number: int
    slot_bytes: int
    segment: torch.UntypedStorage | None


class _Ring:
    """A worker's ring (made in the worker process)."""

    _numbers = itertools.count()

    def __init__(self, slot_bytes: int) -> None:
        self.slot_bytes = slot_bytes
        self.segment = torch.UntypedStorage._new_shared(  # type: ignore[no-untyped-call]
            _HEADER + SLOTS * slot_bytes)
        self.bytes = torch.empty(0, dtype=torch.uint8).set_(self.segment)
        self.flags = self.bytes[:_HEADER].numpy()
        self.flags[:] = _FREE
        self.number = next(self._numbers)
        self.pid = os.getpid()

    def take(self) -> int | None:
        free = np.flatnonzero(self.flags[:SLOTS] == _FREE)
        if not len(free):
            return None
        slot = int(free[0])
        self.flags[slot] = _TAKEN
        return slot

    def slot(self, slot: int, nbytes: int) -> torch.Tensor:
        start = _HEADER + slot * self.slot_bytes
        return self.bytes[start:start + nbytes]

    def token(self) -> Token:
        mapped = self.flags[_MAPPED] != _FREE
        return Token(self.pid, self.number, self.slot_bytes, None if mapped else self.segment)


_ring: _Ring | None = None  # this worker process's


def take(nbytes: int) -> tuple[_Ring, int, torch.Tensor] | None:
    """A free slot of this process's ring for a batch of ``nbytes`` (the ring made, or made
    anew with larger slots, as needed), or None: send the batch the torch way."""
    global _ring
    if _ring is None or nbytes > _ring.slot_bytes:
        slot_bytes = -(-max(nbytes * 5 // 4, 2 * (_ring.slot_bytes if _ring else 0), 4096)
                       // 4096) * 4096
        if SLOTS * slot_bytes > _MOST_BYTES:
            return None
        _ring = _Ring(slot_bytes)  # the old one lives on while the loader's process holds it
    slot = _ring.take()
    if slot is None:
        return None
    return _ring, slot, _ring.slot(slot, nbytes)


# -- the loader's process ----------------------------------------------------------------------
@dataclass
class _Mapped:
    number: int
    slot_bytes: int
    array: np.ndarray  # the whole ring, as numpy (its base holds the segment)


_mapped: dict[int, _Mapped] = {}  # worker pid -> its ring, as mapped here
_lock = threading.Lock()


def view(token: Token, slot: int, nbytes: int) -> torch.Tensor:
    """Slot ``slot`` of ``token``'s ring as a tensor of ``nbytes`` bytes, no copy; the slot is
    freed once this tensor and every view of it are gone."""
    with _lock:
        ring = _mapped.get(token.pid)
        if ring is None or ring.number != token.number:
            if token.segment is None:
                raise RuntimeError(
                    f"pqloader: a batch from worker process {token.pid} names shared memory "
                    "this process has not received; this is a bug in pqloader, please report it")
            _forget_dead()
            array = torch.empty(0, dtype=torch.uint8).set_(token.segment).numpy()
            ring = _mapped[token.pid] = _Mapped(token.number, token.slot_bytes, array)
            array[_MAPPED] = _TAKEN  # the worker stops sending the segment
    start = _HEADER + slot * ring.slot_bytes
    part = ring.array[start:start + nbytes]  # a view of its own: the finalizer's object
    weakref.finalize(part, _free, ring.array, slot, os.getpid())
    return torch.from_numpy(part)


def _free(array: np.ndarray, slot: int, pid: int) -> None:
    """The slot's views are gone: the worker may write it again. Not from a forked child,
    whose copy of a batch is not the parent's: a child letting go of it (or exiting) freed the
    slot of a batch its parent still held, for the worker to write over."""
    if os.getpid() == pid:
        array[slot] = _FREE


def _forget_dead() -> None:
    """Let go of the rings of worker processes that have ended (lock held); a ring still
    viewed is unmapped once its views are gone."""
    for pid in list(_mapped):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            del _mapped[pid]
        except OSError:  # alive, another user's: not ours to judge
            pass


def forget_dead() -> None:
    """At the end of a pass: rings of workers that have ended are let go now."""
    with _lock:
        _forget_dead()


def _forked() -> None:
    """A forked worker has no ring of its own yet, and maps none of its parent's."""
    global _ring, _mapped, _lock
    _ring, _mapped, _lock = None, {}, threading.Lock()


os.register_at_fork(after_in_child=_forked)


def mapped() -> list[tuple[int, int]]:
    """The address ranges of the rings mapped in this process (for tests)."""
    with _lock:
        return [(r.array.ctypes.data, r.array.ctypes.data + r.array.nbytes)
                for r in _mapped.values()]
