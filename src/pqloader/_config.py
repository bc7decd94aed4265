"""The loader's settings: one frozen, validated value shared by the loader and its workers."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ._errors import InvalidArgumentError, check_positive
from ._memory import window_bytes
from ._world import World

WorkerType = Literal["thread", "process"]
MAX_WORKERS = 1024  # num_workers, at most
MAX_AUTO_WORKERS = 8  # num_workers="auto": threads and windows read ahead, one per core, at most
DEFAULT_WINDOW_BYTES = 64 * 2**20  # per worker: the shuffle quality / memory knob's default
# timeout= counts from when the workers have started (processes imported their modules, each
# worker_init_fn returned): starting may take this long more before it is an error too.
START_GRACE_S = 60.0


@dataclass(frozen=True)
class LoaderConfig:
    """What decides an epoch's batches (the plan) and how they are made."""

    batch_size: int
    shuffle: bool = False
    seed: int = 0
    drop_last: bool = False
    shuffle_window_rows: int | None = None
    transform: Callable[..., Any] | None = None
    collate_fn: Callable[..., Any] | None = None
    world: World = field(default_factory=World)
    memory_budget_bytes: int | None = None

    def __post_init__(self) -> None:
        check_positive("batch_size", self.batch_size)
        for name in ("shuffle", "drop_last"):  # shuffle="no" read as True, silently
            object.__setattr__(self, name, flag(name, getattr(self, name)))
        if self.memory_budget_bytes is not None:
            check_positive("memory_budget_bytes", self.memory_budget_bytes)
        check_positive("seed", self.seed, allow_zero=True)
        if self.shuffle_window_rows is not None:
            check_positive("shuffle_window_rows", self.shuffle_window_rows)
        for name in ("transform", "collate_fn"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise InvalidArgumentError(f"{name} must be callable, got {value!r}")

    def window_rows(self, fragment_rows: np.ndarray, byte_size: np.ndarray,
                    streams: int = 1) -> int:
        """Rows per shuffle window: as set, else about 64 MiB of decoded data, or less so that
        ``streams`` worker streams fit in ``memory_budget_bytes``."""
        if self.shuffle_window_rows is not None:
            return self.shuffle_window_rows
        per_row = bytes_per_row(fragment_rows, byte_size)
        if self.memory_budget_bytes is None:
            return max(self.batch_size, int(DEFAULT_WINDOW_BYTES / per_row))
        # A window closes on the row group that reaches window_rows: it can pass the target
        # by one row group, so the target leaves room for the largest.
        target = min(DEFAULT_WINDOW_BYTES, window_bytes(self.memory_budget_bytes, streams))
        largest = int(byte_size.max()) if len(byte_size) else 0
        room = max(0, target - largest)
        heavy = heaviest_rows(fragment_rows, byte_size, room)
        return max(self.batch_size, int(room / per_row) if heavy is None else heavy)


def heaviest_rows(fragment_rows: np.ndarray, byte_size: np.ndarray, room: int) -> int | None:
    """The rows that fit in ``room`` bytes if they are the dataset's heaviest: a window's
    rows may all be of the heaviest row groups (long texts in some files, labels in others),
    and sized by the mean row such a window held 10x its share, the budget 2x. Each row group
    counts its own rows: one tiny one (its footer's fixed costs make its rows look heavy)
    holds a row or two of a window, not all of it. ``None`` when every row fits."""
    if not len(byte_size):
        return None
    weight = byte_size / np.maximum(fragment_rows, 1)
    order = np.argsort(-weight, kind="stable")
    total = np.cumsum(byte_size[order])
    whole = int(np.searchsorted(total, room, side="right"))  # row groups that fit whole
    if whole == len(order):
        return None
    rows = int(fragment_rows[order[:whole]].sum())
    left = room - (int(total[whole - 1]) if whole else 0)
    return rows + int(left / max(float(weight[order[whole]]), 1e-9))


def bytes_per_row(fragment_rows: np.ndarray, byte_size: np.ndarray) -> float:
    """Decoded bytes per row, as estimated from the footers (``_sizes``)."""
    return max(1.0, float(byte_size.sum()) / max(1, int(fragment_rows.sum())))


@dataclass(frozen=True)
class WorkerConfig:
    """How batches are delivered: the torch ``DataLoader`` knobs, with their meaning."""

    num_workers: int = 2
    worker_type: WorkerType = "thread"
    prefetch_factor: int = 2
    pin_memory: bool = False
    timeout: float = 0.0
    worker_init_fn: Callable[[int], Any] | None = None
    persistent_workers: bool = False
    multiprocessing_context: Any = None

    def __post_init__(self) -> None:
        check_positive("num_workers", self.num_workers, allow_zero=True)
        if self.num_workers > MAX_WORKERS:  # 100,000 made threads for minutes (found in review)
            raise InvalidArgumentError(
                f"num_workers={self.num_workers:,}: at most {MAX_WORKERS:,}; a worker a core "
                f"or two is plenty (this machine has {os.cpu_count()}), or num_workers='auto'")
        check_positive("prefetch_factor", self.prefetch_factor)
        for name in ("pin_memory", "persistent_workers"):
            object.__setattr__(self, name, flag(name, getattr(self, name)))
        if self.worker_type not in ("thread", "process"):
            raise InvalidArgumentError(
                f"worker_type must be 'thread' or 'process', got {self.worker_type!r}"
            )
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) \
                or not math.isfinite(self.timeout) or self.timeout < 0:
            raise InvalidArgumentError(  # inf overflowed a wait; nan timed out at once
                f"timeout must be finite seconds >= 0 (0: wait as long as it takes), got "
                f"{self.timeout!r}")
        if self.worker_init_fn is not None and not callable(self.worker_init_fn):
            raise InvalidArgumentError(
                f"worker_init_fn must be callable, got {self.worker_init_fn!r}"
            )
        if self.persistent_workers and self.num_workers == 0:
            raise InvalidArgumentError("persistent_workers=True needs num_workers > 0")


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def flag(name: str, value: Any) -> bool:
    """A yes/no argument as a bool: True, False, 0, 1, numpy's and torch's booleans (as torch
    takes them: configs from YAML or argparse hold 0 and 1); a string or None is refused."""
    try:
        as_number = int(value) if bool(int(value) == value) else -1  # (not 0.5)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        as_number = -1
    shaped = bool(getattr(value, "ndim", False))  # an array of one: not a yes or a no
    if isinstance(value, (str, bytes)) or shaped or as_number not in (0, 1):
        raise InvalidArgumentError(f"{name} must be True or False, got {value!r}")
    return bool(as_number)


def refuse_torch_order(**given: Any) -> None:
    """torch's ``sampler``, ``batch_sampler`` and ``generator``, refused by name (they were
    Python's bare "unexpected keyword argument")."""
    for name, value in given.items():
        if value is not None:
            raise InvalidArgumentError(
                f"{name}= is torch's: pqloader.DataLoader orders the rows itself (shuffle=True, "
                "seed=<int> for the order, the ranks from torch.distributed); for an order of "
                "your own, give torch.utils.data.DataLoader the map-style dataset "
                f"(DataLoader(ds, {name}=...)): rows are then read one by one, slower")


def refuse_torch_placement(*, in_order: Any, pin_memory_device: Any) -> None:
    """torch's ``in_order=False`` and ``pin_memory_device=``, refused by name (they were
    Python's bare "unexpected keyword argument")."""
    if not flag("in_order", in_order):
        raise InvalidArgumentError(
            "in_order=False: pqloader.DataLoader yields batches in the plan's order always "
            "(an exact resume counts on it), a slow batch holding those after it as torch's "
            "default does; leave in_order out")
    if pin_memory_device:
        raise InvalidArgumentError(
            f"pin_memory_device={pin_memory_device!r} is torch's (deprecated there): "
            "device='cuda' delivers batches on the device, staged in pinned memory; "
            "pin_memory=True pins them for the current device")


def resolve_num_workers(num_workers: int | str, worker_type: str) -> tuple[int, bool]:
    """(workers: the streams planned, or for ``"auto"`` the most threads and windows read
    ahead; whether to tune the active threads online)."""
    if isinstance(num_workers, str) and num_workers != "auto":
        raise InvalidArgumentError(f"num_workers must be an int >= 0 or 'auto', got "
                                   f"{num_workers!r}")
    if num_workers != "auto":
        return num_workers, False  # type: ignore[return-value]  # validated by WorkerConfig
    if worker_type != "thread":
        raise InvalidArgumentError(
            "num_workers='auto' tunes thread workers while batches flow; with "
            f"worker_type={worker_type!r} pass a number (`pqloader bench PATH --worker-type "
            f"{worker_type} --num-workers N` measures one; `tune` tries thread workers)"
        )
    return min(MAX_AUTO_WORKERS, cores()), True
