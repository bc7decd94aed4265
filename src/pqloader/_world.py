"""Where this process stands: rank and world size, explicit or from ``torch.distributed``."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ._errors import InvalidArgumentError


@dataclass(frozen=True)
class World:
    """A rank among ``world_size`` ranks."""

    rank: int = 0
    world_size: int = 1
    implicit: bool = False  # taken from torch.distributed (or its absence), not passed

    def __post_init__(self) -> None:
        for name, value in (("rank", self.rank), ("world_size", self.world_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgumentError(f"{name} must be an int, got {value!r}")
        if self.world_size < 1:
            raise InvalidArgumentError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise InvalidArgumentError(
                f"rank must be in [0, world_size={self.world_size}), got rank={self.rank}"
            )


def resolve_world(rank: int | None, world_size: int | None) -> World:
    """Explicit values win; else an initialised ``torch.distributed``; else a single rank."""
    if (rank is None) != (world_size is None):
        raise InvalidArgumentError(
            f"pass rank and world_size together (got rank={rank}, world_size={world_size}), "
            "or neither to take them from torch.distributed"
        )
    if rank is not None and world_size is not None:
        return World(rank, world_size)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), implicit=True)
    return World(implicit=True)


def check_world(world: World, what: str) -> None:
    """Refuse to iterate a ``what`` that took one rank for lack of ``torch.distributed``, once
    it is initialised with several: every rank would deliver every row (``DistributedSampler``
    raises too), or that a launcher says is one of several (``WORLD_SIZE``) without one.
    Checked at each pass, where no collective is needed."""
    if not world.implicit or world.world_size > 1:
        return
    import torch.distributed as dist

    initialized = dist.is_available() and dist.is_initialized()
    launched = os.environ.get("WORLD_SIZE", "")
    if not initialized and launched.isdigit() and int(launched) > 1:
        # torchrun's processes without init_process_group each read every row, silently
        # (found in review; torch's DistributedSampler raises there too)
        raise InvalidArgumentError(
            f"WORLD_SIZE={launched} says this process is one of {launched} (torchrun sets it), "
            f"but torch.distributed is not initialised, so this {what} took a single rank and "
            f"each process would get every row: call torch.distributed.init_process_group "
            "first, or pass rank= and world_size= (rank=0, world_size=1 to read every row in "
            "each process on purpose)")
    if initialized and dist.get_world_size() > 1:
        raise InvalidArgumentError(
            f"this {what} was built before torch.distributed.init_process_group, so it took "
            f"a single rank, and each of the {dist.get_world_size()} ranks would get every row: "
            "build it after init_process_group, or pass rank= and world_size= (rank=0, "
            "world_size=1 to read every row on each rank on purpose)")
