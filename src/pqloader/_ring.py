"""Batches from a worker process through slots of shared memory it reuses.

Sent the torch way, each batch is a new shared-memory segment: created, faulted in page by page
and filled by the worker, its file descriptor passed over a socket to the loader's process,
mapped there, and unmapped by both. For a 540 KB batch (W1) creating and faulting the segment
took 400 of the worker's ~480 us, against 80 us to fill one made before (measured), and the
loader's process spent ~490 us of CPU receiving each.

Here a worker process makes a *ring* of slots once, each slot a segment of its own, plus a
header of flags, and sends their segments (the torch way) until the loader's process says it
has mapped them. A batch is written into a free slot, and only the slot's number crosses with
the pickled rest. The loader's process hands out views of the slot (no copy) and marks the
slot free once the last of them is gone (a finalizer). So:

- a slot the consumer still holds is never written over: with every slot held, a batch goes the
  torch way; a ring whose slots stay held (batches kept, or a fork, below) is left to its
  holders after a while and a new one made;
- a view kept pins its own slot, not the ring (one segment per slot: a review measured 10x the
  memory when one kept image pinned its whole ring);
- a fork of the loader's process while it holds views (a forked saver or logger given a batch)
  shares those slots with the child: they are never freed then, since the parent cannot know
  when the child lets go (at the fork, their finalizers are detached);
- a ring is known by its worker's pid and a random number (a pid reused by a later worker is no
  match: found in review);
- only under torch's default ``file_descriptor`` sharing strategy: under ``file_system`` a
  segment lives until every process that mapped it lets go, and a worker ends with
  ``os._exit``: each ring was left in ``/dev/shm`` (found in review).

One byte per slot, in the header, says whose it is: the worker sets it taken before it writes,
the loader's process clears it when the views are gone. The header's last byte says the
loader's process has mapped the ring (the worker stops sending it).
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass

import numpy as np
import torch
import torch.multiprocessing

SLOTS = 8  # per worker: torch's prefetch_factor (2) in flight, the caller's, a pinning thread's
_BESIDE = SLOTS - 2  # slots beyond those in flight: held by the caller, a pinning thread
_FEWEST = 4  # slots of a ring of large batches (each ring at most _MOST_BYTES)
_HEADER = 64  # bytes: a flag per slot, the ring's "mapped" flag last
_MAPPED = _HEADER - 1
_MOST_BYTES = 256 * 2**20  # a ring's slots together at most: a larger batch goes the torch way
# ... and at most this share of what /dev/shm has free when it is made: a ring's slots stay
# (torch's way frees each batch's segment), and a container's /dev/shm is small (Docker: 64 MB
# by default), where a write past what is free kills the process (SIGBUS)
_SHARE = 8
_RENEW = 2  # a ring found full for this many times its slots in a row is left to its holders
_FREE, _TAKEN = 0, 1


def _shared(nbytes: int) -> torch.Tensor:
    storage = torch.UntypedStorage._new_shared(nbytes)  # type: ignore[no-untyped-call]
    return torch.empty(0, dtype=torch.uint8).set_(storage)


@dataclass(frozen=True)
class Token:
    """A ring, as a message names it: its worker's pid and a random number, with its header and
    slots while the loader's process may not have mapped them yet."""

    pid: int
    number: int
    segments: tuple[torch.Tensor, ...] | None  # the header, then the slots


class _Ring:
    """A worker's ring (made in the worker process)."""

    def __init__(self, slot_bytes: int, slots: int) -> None:
        self.slot_bytes = slot_bytes
        self.header = _shared(_HEADER)
        self.flags = self.header.numpy()
        self.flags[:] = _FREE
        self.slots = [_shared(slot_bytes) for _ in range(slots)]
        self.number = int.from_bytes(os.urandom(8), "little")
        self.pid = os.getpid()
        self.full = 0  # takes in a row that found no slot free

    def take(self) -> int | None:
        free = np.flatnonzero(self.flags[:len(self.slots)] == _FREE)
        if not len(free):
            self.full += 1
            return None
        self.full = 0
        slot = int(free[0])
        self.flags[slot] = _TAKEN
        return slot

    def token(self) -> Token:
        mapped = self.flags[_MAPPED] != _FREE
        return Token(self.pid, self.number, None if mapped else (self.header, *self.slots))


_ring: _Ring | None = None  # this worker process's
_slots = SLOTS  # of a ring made here


def in_flight(prefetch_factor: int) -> None:
    """This worker has up to ``prefetch_factor`` batches in flight: its rings get that many
    slots besides those the caller holds (a deeper prefetch sent the rest the torch way)."""
    global _slots
    _slots = min(max(SLOTS, prefetch_factor + _BESIDE), _MAPPED)  # a flag each in the header


def take(nbytes: int) -> tuple[_Ring, int, torch.Tensor] | None:
    """A free slot of this process's ring for a batch of ``nbytes`` (the ring made, or made
    anew with larger slots or after staying full, as needed), or None: send the batch the
    torch way."""
    global _ring
    if torch.multiprocessing.get_sharing_strategy() != "file_descriptor":  # type: ignore[no-untyped-call]
        return None
    if _ring is None or nbytes > _ring.slot_bytes or _ring.full >= _RENEW * len(_ring.slots):
        least = _ring.slot_bytes if _ring is not None and nbytes <= _ring.slot_bytes else \
            2 * (_ring.slot_bytes if _ring is not None else 0)
        slot_bytes = -(-max(nbytes * 5 // 4, least, 4096) // 4096) * 4096
        most = min(_MOST_BYTES, _room() // _SHARE)
        fit = most // slot_bytes  # as many as wanted that fit, not fewer than _FEWEST
        slots = min(_slots, fit) if fit >= _FEWEST else 0
        if slots:
            _ring = _Ring(slot_bytes, slots)  # an old one lives on while its views do
        elif _ring is None or nbytes > _ring.slot_bytes:
            return None
        else:  # no room for a new one: the full one's slots may come free yet
            _ring.full = 0
    slot = _ring.take()
    if slot is None:
        return None
    return _ring, slot, _ring.slots[slot][:nbytes]


def _room() -> int:
    """Bytes free in /dev/shm, where the segments live (where it cannot be told, as if it
    held any ring)."""
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return _MOST_BYTES * _SHARE
    return stat.f_bavail * stat.f_frsize


# -- the loader's process ----------------------------------------------------------------------
@dataclass
class _Mapped:
    number: int
    flags: np.ndarray  # the header
    slots: list[np.ndarray]  # each a numpy view of its segment (its base holds the segment)


_mapped: dict[int, _Mapped] = {}  # worker pid -> its ring, as mapped here
_live: dict[tuple[int, int, int], weakref.finalize[..., object]] = {}  # (pid, number, slot)
# Reentrant: a finalizer may run in a garbage collection that an allocation here set off, in
# this thread, as may a pass's end (forget_dead) of an iterator collected then (a hang, found
# in review).
_lock = threading.RLock()


def view(token: Token, slot: int, nbytes: int) -> torch.Tensor:
    """Slot ``slot`` of ``token``'s ring as a tensor of ``nbytes`` bytes, no copy; the slot is
    freed once this tensor and every view of it are gone."""
    with _lock:
        ring = _mapped.get(token.pid)
        if ring is None or ring.number != token.number:
            if token.segments is None:
                raise RuntimeError(
                    f"pqloader: a batch from worker process {token.pid} names shared memory "
                    "this process has not received; this is a bug in pqloader, please report it")
            _forget_dead()
            header, *slots = (t.numpy() for t in token.segments)
            ring = _mapped[token.pid] = _Mapped(token.number, header, slots)
            header[_MAPPED] = _TAKEN  # the worker stops sending the segments
        part = ring.slots[slot][:nbytes]  # a view of its own: the finalizer's object
        key = (token.pid, token.number, slot)
        _live[key] = weakref.finalize(part, _free, ring.flags, slot, os.getpid(), key)
    return torch.from_numpy(part)


def _free(flags: np.ndarray, slot: int, pid: int, key: tuple[int, int, int]) -> None:
    """The slot's views are gone: the worker may write it again (not from a forked child: its
    finalizers were detached at the fork, and a child exiting runs what is left)."""
    if os.getpid() != pid:
        return
    with _lock:
        if _live.pop(key, None) is not None:
            flags[slot] = _FREE


def _forget_dead() -> None:
    """Let go of the rings of worker processes that have ended (lock held); a slot still
    viewed is unmapped once its views are gone."""
    for pid in list(_mapped):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _mapped.pop(pid, None)
        except OSError:  # alive, another user's: not ours to judge
            pass


def forget_dead() -> None:
    """At the end of a pass: rings of workers that have ended are let go now."""
    with _lock:
        _forget_dead()


def _forking() -> None:
    """A fork shares the slots this process views with the child, which may hold its copy of
    a batch after the parent lets go of its own: those slots are never freed (their
    finalizers detached), or the worker would write over the child's batch (found in review).
    The lock is held until the fork is made, so that no view is given out meanwhile."""
    _lock.acquire()
    for finalizer in _live.values():
        finalizer.detach()
    _live.clear()


def _forked_parent() -> None:
    _lock.release()


def _forked() -> None:
    """A forked child (a worker) has no ring of its own yet, and maps none of its parent's."""
    global _ring, _slots, _mapped, _live, _lock
    _ring, _slots, _mapped, _live, _lock = None, SLOTS, {}, {}, threading.RLock()


os.register_at_fork(before=_forking, after_in_parent=_forked_parent, after_in_child=_forked)


def mapped() -> list[tuple[int, int]]:
    """The address ranges of the slots mapped in this process (for tests)."""
    with _lock:
        return [(a.ctypes.data, a.ctypes.data + a.nbytes)
                for r in _mapped.values() for a in r.slots]
