"""ParquetDataset: the fragment index of a sharded dataset, map-style access, ``to_torch()``."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ._cache import Cache
from ._discover import Discovery, discover, read_footers
from ._errors import InvalidArgumentError
from ._fs import make_store
from ._read import FragmentReader
from ._retry import RetryPolicy

if TYPE_CHECKING:
    import pyarrow.parquet as pq

    from ._torch import TorchIterable

_ROW_GROUP_CACHE = 4  # decoded row groups kept for map-style access


class ParquetDataset:
    """A directory, glob or list of Parquet files, seen as one table.

    Args:
        source: a directory (searched recursively; ``_*``, ``.*`` and ``*.crc`` are skipped,
            hive ``key=value`` folders become columns), a glob, a file, or a list of these;
            local paths or URLs of any fsspec filesystem (``s3://bucket/prefix/``, ``gs://``,
            ``az://``, ``https://``, ``memory://``).
        columns: the columns to read, in this order; all by default.
        storage_options: options of the URL's fsspec filesystem (credentials, endpoint...).
        filesystem: a ready fsspec or ``pyarrow.fs`` filesystem to read ``source`` paths with.
        cache: a :class:`pqloader.Cache` (or a directory for one) keeping fetched remote bytes
            on local disk, shared by workers and jobs; ignored for local files.
        retry: the :class:`pqloader.RetryPolicy` of remote requests (attempts, backoff,
            per-request timeout, concurrency).
        verify_checksums: check each page's CRC (files written by :func:`write_dataset`, or
            by Spark, carry them), so a corrupt page raises :class:`CorruptFileError` instead
            of decoding to wrong values. Off by default: it costs ~35-50% of decode time
            (measured), and pages without a CRC are not checked.

    Footers are read in parallel when the dataset opens, or not at all when the folder holds
    the manifest that :func:`write_dataset` writes; no data is read until asked for.
    Map-style access (``ds[i]``, ``ds.__getitems__(indices)``) makes the dataset work with
    ``torch.utils.data.DataLoader`` and any sampler; for training throughput use
    :class:`pqloader.DataLoader` or :meth:`to_torch`.
    """

    def __init__(self, source: Any, *, columns: Sequence[str] | None = None,
                 verify_checksums: bool = False, storage_options: dict[str, Any] | None = None,
                 filesystem: Any = None, cache: Cache | str | os.PathLike[str] | None = None,
                 retry: RetryPolicy | None = None) -> None:
        if isinstance(columns, str):
            raise InvalidArgumentError(f"columns must be a list of names, got {columns!r}")
        store = make_store(source, storage_options, filesystem, retry)
        if cache is not None and not isinstance(cache, Cache):
            cache = Cache(cache)
        discovery = discover(source, columns, store=store,
                             cache=cache if store is not None else None)
        self.__setstate__({"discovery": discovery, "verify_checksums": bool(verify_checksums)})

    def __getstate__(self) -> dict[str, Any]:
        return {"discovery": self._discovery, "verify_checksums": self._reader.verify_checksums}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._discovery: Discovery = state["discovery"]
        self._reader = FragmentReader(self._discovery, verify_checksums=state["verify_checksums"])
        self._offsets = np.concatenate([[0], np.cumsum(self._discovery.num_rows)])
        self._cache: OrderedDict[int, pa.Table] = OrderedDict()
        self._lock = threading.Lock()

    # -- structure -------------------------------------------------------------------------
    @property
    def schema(self) -> pa.Schema:
        """The unified Arrow schema of the projected columns."""
        return self._discovery.schema

    @property
    def columns(self) -> dict[str, pa.DataType]:
        """``{name: type}`` of the projected columns."""
        return {f.name: f.type for f in self._discovery.schema}

    @property
    def files(self) -> list[str]:
        return [f.path for f in self._discovery.files]

    @property
    def metadata(self) -> list[pq.FileMetaData]:
        """The Parquet footer of each file, in :attr:`files` order (read now if the dataset
        was opened from its manifest)."""
        d = self._discovery
        return read_footers(d.files, d.store, d.cache)

    def io_stats(self) -> dict[str, int]:
        """Counts of this dataset's remote IO: requests, bytes, retries, throttled, timeouts,
        cache hits/misses/corrupt entries, and the adaptive concurrency limit. Worker threads
        and worker processes (pqloader's or torch's) count here too; ``concurrency`` is this
        process's own. Empty for local datasets."""
        store = self._discovery.store
        return {} if store is None else store.stats.as_dict()

    @property
    def num_row_groups(self) -> int:
        """Non-empty row groups (fragments) across all files."""
        return len(self._discovery.num_rows)

    @property
    def fragment_rows(self) -> np.ndarray:
        """Rows of each fragment, in index order (read-only)."""
        rows = self._discovery.num_rows.view()
        rows.flags.writeable = False
        return rows

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def __repr__(self) -> str:
        cols = ", ".join(f"{n}: {t}" for n, t in self.columns.items())
        return (f"ParquetDataset({len(self):,} rows, {len(self.files)} files, "
                f"{self.num_row_groups} row groups; {cols})")

    # -- map-style access -------------------------------------------------------------------
    def _fragment(self, fragment: int) -> pa.Table:
        with self._lock:
            table = self._cache.get(fragment)
            if table is not None:
                self._cache.move_to_end(fragment)
                return table
        table = self._reader.read(fragment)
        with self._lock:
            self._cache[fragment] = table
            while len(self._cache) > _ROW_GROUP_CACHE:
                self._cache.popitem(last=False)
        return table

    def _wrap(self, indices: np.ndarray) -> np.ndarray:
        """Indices checked against ``len(self)``, negative ones counted from the end."""
        n = len(self)
        bad = (indices < -n) | (indices >= n)
        if bad.any():
            raise IndexError(f"row {int(indices[bad][0])} is out of range for {n} rows")
        return np.where(indices < 0, indices + n, indices)

    def _locate(self, indices: np.ndarray) -> np.ndarray:
        """The fragment of each (already wrapped, in-range) row index."""
        return np.searchsorted(self._offsets, indices, side="right") - 1

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an int, got {type(index).__name__}; "
                            "use __getitems__ for a list of rows")
        return self.__getitems__([int(index)])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Rows as dicts, in the order asked; each needed row group is read once."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size == 0:
            return []
        idx = self._wrap(idx)  # once: wrapping twice turned -n-1 into a pyarrow error
        frags = self._locate(idx)
        rows: list[dict[str, Any]] = [{}] * len(idx)
        for frag in np.unique(frags):
            where = np.flatnonzero(frags == frag)
            local = idx[where] - self._offsets[frag]
            part = self._fragment(int(frag)).take(pa.array(local)).to_pylist()
            for i, row in zip(where, part, strict=True):
                rows[i] = row
        return rows

    # -- iteration --------------------------------------------------------------------------
    def to_torch(self, *, batch_size: int, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False, **options: Any) -> TorchIterable:
        """A ``torch.utils.data.IterableDataset`` of batches, safe under torch's own workers.

        Use it with ``torch.utils.data.DataLoader(it, batch_size=None, num_workers=N)``: it
        splits the work by rank and by ``get_worker_info()``, so every row comes exactly once.
        Other keywords (``transform``, ``collate_fn``, ``shuffle_window_rows``, ``rank``,
        ``world_size``) mean what they mean for :class:`pqloader.DataLoader`.
        """
        from ._torch import TorchIterable

        return TorchIterable(self, batch_size=batch_size, shuffle=shuffle, seed=seed,
                             drop_last=drop_last, **options)

    @property
    def reader(self) -> FragmentReader:
        """The fragment reader (internal: used by the loader)."""
        return self._reader
