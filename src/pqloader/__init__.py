"""pqloader: feed PyTorch training from large sharded Parquet datasets.

Shuffled across files, exactly once per epoch over ranks and workers, in bounded memory.
"""

from ._audit import EpochReport, audit
from ._cache import Cache
from ._dataset import ParquetDataset
from ._errors import (
    ColumnNotFoundError,
    CorruptFileError,
    DataError,
    DatasetNotFoundError,
    EmptyDatasetError,
    InvalidArgumentError,
    LoaderTimeoutError,
    PQLoaderError,
    RemoteIOError,
    SchemaMismatchError,
    StateMismatchError,
)
from ._loader import DataLoader
from ._retry import RetryPolicy
from ._torch import TorchIterable
from ._write import write_dataset

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
    "InvalidArgumentError",
    "LoaderTimeoutError",
    "PQLoaderError",
    "ParquetDataset",
    "RemoteIOError",
    "RetryPolicy",
    "SchemaMismatchError",
    "StateMismatchError",
    "TorchIterable",
    "__version__",
    "audit",
    "write_dataset",
]
