"""ParquetDataset: the fragment index of a sharded dataset, map-style access, ``to_torch()``."""

from __future__ import annotations

import itertools
import operator
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, overload

import numpy as np
import pyarrow as pa

from ._cache import Cache
from ._discover import Discovery, discover, read_footers
from ._errors import CorruptFileError, DataError, InvalidArgumentError, bad_text
from ._fs import lower_scheme, make_store
from ._kept import count_kept
from ._measure import measure_strings
from ._read import FragmentReader
from ._retry import RetryPolicy

if TYPE_CHECKING:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from ._torch import TorchIterable

_ROW_GROUP_CACHE = 4  # decoded row groups kept for map-style access
_REPR_ALL = 40  # a repr names every column up to this many,
_REPR_COLUMNS = 30  # else this many (ds.columns has them all)


def _row_numbers(indices: Any, num_rows: int) -> np.ndarray:
    """``indices`` as int64 rows in ``[0, num_rows)``, negative ones counted from the end.

    Integers only (bools and floats are not row numbers: ``[1.9, "3"]`` used to read rows 1
    and 3), in a flat sequence. Checked in one numpy pass; only input that numpy does not type
    as integers (an error, or ints of mixed signedness) is looked at one value at a time.
    """
    try:
        idx = np.asarray(indices)
    except (TypeError, ValueError) as exc:  # ragged nesting
        raise TypeError(f"indices must be a flat sequence of ints, got {indices!r:.80}") from exc
    if idx.ndim != 1:
        got = f"shape {idx.shape}"
        if idx.ndim == 0:  # a set or a generator is one object to numpy
            got = f"a {type(indices).__name__} (pass a list)" if hasattr(indices, "__iter__") \
                else "a single value (ds[i] reads one row)"
        raise TypeError(f"indices must be a 1-D sequence of ints, got {got}")
    if idx.size == 0:
        return np.zeros(0, dtype=np.int64)
    if idx.dtype.kind not in "iu":  # (a bool in a list of ints passes as 0 or 1, as in numpy)
        values = list(indices) if isinstance(indices, (list, tuple)) else idx.tolist()
        idx = _exact_ints(values, num_rows)
    # compared before the cast to int64, which wrapped a large uint64 to a negative number
    bad = idx >= num_rows if idx.dtype.kind == "u" else (idx < -num_rows) | (idx >= num_rows)
    if bad.any():
        raise IndexError(f"row {int(idx[bad][0])} is out of range for {num_rows} rows")
    idx = idx.astype(np.int64, copy=False)
    return np.where(idx < 0, idx + num_rows, idx)


def _exact_ints(values: list[Any], num_rows: int) -> np.ndarray:
    """Values numpy did not type as integers: an int64 array of them, or the error naming one."""
    for value in values:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"row index {value!r} is a {type(value).__name__}, not an int; "
                            f"the dataset's {num_rows} rows are numbered from 0 (negative: "
                            "from the end)")
    for value in values:  # ints beyond int64 (numpy made them floats or objects), or mixed
        if not -num_rows <= value < num_rows:
            raise IndexError(f"row {int(value)} is out of range for {num_rows} rows")
    return np.array([int(v) for v in values], dtype=np.int64)


class ParquetDataset:
    """A directory, glob or list of Parquet files, seen as one table.

    Args:
        source: a directory (searched recursively; ``_*``, ``.*`` and ``*.crc`` are skipped,
            hive ``key=value`` folders become columns), a glob, a file, or a list of these;
            local paths or URLs of any fsspec filesystem (``s3://bucket/prefix/``, ``gs://``,
            ``az://``, ``https://``, ``memory://``). Folders and globs are read in sorted
            order; a list keeps its own, each file once: give every DDP rank the same list
            (sort one built with ``os.listdir``, whose order differs between machines).
        columns: the columns to read, in this order; all by default.
        filter: the rows to read: a ``pyarrow.compute`` expression
            (``pc.field("split") == "train"``) or the list of ``(column, op, value)`` tuples
            of ``pyarrow.parquet.read_table(filters=...)``. Rows where it is false or null are
            left out; it may read columns not in ``columns``. The rows it keeps are counted
            when the dataset opens, by reading the filter's columns once (not those of row
            groups that the footers' statistics or the hive folders rule out), so ``len``,
            ``ds[i]``, epochs, ranks and resume states are all of the kept rows.
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
        on_bad_file: ``"raise"`` (the default): a file whose footer cannot be read (not
            Parquet, truncated or empty, not readable by this process, a broken link) is an
            error naming it. ``"skip"``: such files are left out of the dataset, warned of,
            and listed in :attr:`skipped_files` (Spark's ``ignoreCorruptFiles``; a remote
            read that failed after its retries is still an error). Files are judged by
            their footers when the dataset opens: a damaged page, or a file opened from the
            manifest that is damaged later, is an error at its read. Ranks that skipped
            other files open other datasets, which the ranks' check refuses.

    Footers are read in parallel when the dataset opens, or not at all when the folder holds
    the manifest that :func:`write_dataset` writes; no data is read until asked for.
    Map-style access (``ds[i]``, ``ds.__getitems__(indices)``) makes the dataset work with
    ``torch.utils.data.DataLoader`` and any sampler; for training throughput use
    :class:`pqloader.DataLoader` or :meth:`to_torch`.
    """

    def __init__(self, source: Any, *, columns: Sequence[str] | None = None, filter: Any = None,
                 verify_checksums: bool = False, storage_options: dict[str, Any] | None = None,
                 filesystem: Any = None, cache: Cache | str | os.PathLike[str] | None = None,
                 retry: RetryPolicy | None = None, on_bad_file: str = "raise") -> None:
        if isinstance(columns, str):
            raise InvalidArgumentError(f"columns must be a list of names, got {columns!r}")
        if on_bad_file not in ("raise", "skip"):
            raise InvalidArgumentError(f"on_bad_file={on_bad_file!r}: pass 'raise' (the "
                                       "default) or 'skip'")
        source = lower_scheme(source)
        store = make_store(source, storage_options, filesystem, retry)
        if cache is not None and not isinstance(cache, Cache):
            cache = Cache(cache)
        discovery = measure_strings(discover(source, columns, filter=filter, store=store,
                                             cache=cache if store is not None else None,
                                             skip=on_bad_file == "skip"))
        if skipped := discovery.skipped:
            warnings.warn(
                f"{len(skipped):,} of {len(skipped) + len(discovery.files):,} files left out "
                f"(on_bad_file='skip'), their rows with them: {skipped[0][1]}"
                f"{'' if len(skipped) == 1 else '; ...'} (ds.skipped_files lists them all)",
                UserWarning, stacklevel=2)
        if discovery.filter is not None:
            discovery = count_kept(discovery)
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
    def filter(self) -> pc.Expression | None:
        """The ``filter=`` expression that picks the rows (a list of tuples as converted), or
        None."""
        f = self._discovery.filter
        return None if f is None else f.expression

    @property
    def files(self) -> list[str]:
        return [f.path for f in self._discovery.files]

    @property
    def skipped_files(self) -> dict[str, str]:
        """``{file: why}`` of each file ``on_bad_file="skip"`` left out (empty otherwise)."""
        return dict(self._discovery.skipped)

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
        """Non-empty row groups (fragments) across all files; with a filter, those it keeps
        rows of."""
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
        most = len(self.columns) if len(self.columns) <= _REPR_ALL else _REPR_COLUMNS
        shown = list(itertools.islice(self.columns.items(), most))
        cols = ", ".join(f"{n}: {t}" for n, t in shown)
        if len(self.columns) > len(shown):  # 5,000 columns made a 69 KB repr
            cols += f", ... ({len(self.columns) - len(shown):,} more: ds.columns)"
        f = self._discovery.filter
        kept = "" if f is None else f" kept by filter {f.text}"
        skipped = f" ({len(self.skipped_files):,} skipped)" if self.skipped_files else ""
        return (f"ParquetDataset({len(self):,} rows{kept}, {len(self.files)} files{skipped}, "
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

    def _locate(self, indices: np.ndarray) -> np.ndarray:
        """The fragment of each (already wrapped, in-range) row index."""
        return np.searchsorted(self._offsets, indices, side="right") - 1

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):  # ds[10:20]: those rows, as __getitems__ gives them
            return self.__getitems__(range(*index.indices(len(self))))
        # any integer (numpy's, a 0-d array, a one-element integer tensor: what torch's
        # SubsetRandomSampler and Subset pass), not a bool
        boolean = isinstance(index, bool) or str(getattr(index, "dtype", "")) in ("bool",
                                                                                  "torch.bool")
        try:
            row = operator.index(index)
        except TypeError:
            boolean = True
        if boolean:
            raise TypeError(f"index must be an int or a slice, got {type(index).__name__}; "
                            "for a list of rows, ds.__getitems__(indices)")
        return self.__getitems__([row])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Rows as dicts, in the order asked; each needed row group is read once."""
        idx = _row_numbers(indices, len(self))
        if idx.size == 0:
            return []
        frags = self._locate(idx)
        rows: list[dict[str, Any]] = [{}] * len(idx)
        for frag in np.unique(frags):
            where = np.flatnonzero(frags == frag)
            local = idx[where] - self._offsets[frag]
            part = _rows(self._fragment(int(frag)).take(pa.array(local)),
                         self._discovery.where(int(frag)))
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


def _rows(table: pa.Table, where: str) -> list[dict[str, Any]]:
    """A table's rows as dicts; text that is not UTF-8 named by its row group and column."""
    try:
        rows: list[dict[str, Any]] = table.to_pylist()
    except UnicodeDecodeError as exc:
        name = next((c for c in table.column_names if not _decodes(table.column(c))), "?")
        raise CorruptFileError(f"{where}: {bad_text(name, exc)}") from exc
    except (OverflowError, ValueError) as exc:  # a date or time Python's types cannot hold
        name = next((c for c in table.column_names if not _decodes(table.column(c))), "?")
        raise DataError(
            f"{where}: column {name!r} ({table.schema.field(name).type if name != '?' else '?'}"
            f") holds a value Python's types cannot hold ({exc}); the DataLoader gives its "
            "numbers as a tensor, or cast it to int64 when writing") from exc
    return rows


def _decodes(column: pa.ChunkedArray) -> bool:
    try:
        column.to_pylist()
    except (UnicodeDecodeError, OverflowError, ValueError):
        return False
    return True
