"""Where this process stands: rank and world size, explicit or from ``torch.distributed``."""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import InvalidArgumentError


@dataclass(frozen=True)
class World:
    """A rank among ``world_size`` ranks."""

    rank: int = 0
    world_size: int = 1

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
        return World(dist.get_rank(), dist.get_world_size())
    return World()
