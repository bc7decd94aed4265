"""pqloader: feed PyTorch training from large sharded Parquet datasets.

Shuffled across files, exactly once per epoch over ranks and workers, in bounded memory.
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._audit import EpochReport, audit
from ._cache import Cache
from ._dataset import ParquetDataset
from ._errors import (
    ColumnNotFoundError,
    CorruptFileError,
    DataError,
    DatasetNotFoundError,
    EmptyDatasetError,
    IncompleteEpochError,
    InvalidArgumentError,
    LoaderTimeoutError,
    PermissionDeniedError,
    PQLoaderError,
    RemoteIOError,
    SchemaMismatchError,
    StateMismatchError,
)
from ._retry import RetryPolicy
from ._write import write_dataset

if TYPE_CHECKING:
    from ._loader import DataLoader
    from ._torch import TorchIterable

# Imported when first used: they import torch (1-2 s), which opening, inspecting, writing and
# caching datasets (the CLI, a Spark job's writer) do without.
_IMPORTED_WHEN_USED = {"DataLoader": "._loader", "TorchIterable": "._torch"}

__version__ = "0.1.0"

__all__ = [
    "Cache",
    "ColumnNotFoundError",
    "CorruptFileError",
    "DataError",
    "DataLoader",
    "DatasetNotFoundError",
    "EmptyDatasetError",
    "EpochReport",
    "IncompleteEpochError",
    "InvalidArgumentError",
    "LoaderTimeoutError",
    "PQLoaderError",
    "ParquetDataset",
    "PermissionDeniedError",
    "RemoteIOError",
    "RetryPolicy",
    "SchemaMismatchError",
    "StateMismatchError",
    "TorchIterable",
    "__version__",
    "audit",
    "write_dataset",
]


def __getattr__(name: str) -> Any:
    if name in _IMPORTED_WHEN_USED:
        value = getattr(importlib.import_module(_IMPORTED_WHEN_USED[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
