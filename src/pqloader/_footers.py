"""Parquet footers: a local file's, read in parallel by chunks, and a remote file's, from one
ranged request for its tail (through the cache)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ._cache import Cache
from ._errors import CorruptFileError, PQLoaderError, regular, unreadable
from ._fetch import cached_ranges
from ._fs import ObjectInfo, Store
from ._int96 import file_schema
from ._sizes import RowBytes, row_bytes
from ._stamps import Stamp, stamp_of
from ._threads import executor

# Local footers: parsing one holds the GIL for most of its ~100 us, and 32 threads on 2 cores
# fought over it. Opening 2,000 cached footers (medians, shared 2-core VM): 32 threads a file
# each 0.42-0.52 s, 8 threads taking chunks 0.35-0.40 s, one thread 0.22 s; threads stay, to
# keep IO in flight on cold or network disks.
_LOCAL_FOOTER_THREADS = 8
_LOCAL_FOOTER_CHUNKS = 4  # chunks per thread: a slow chunk does not leave the others idle
_TAIL_BYTES = 64 << 10  # a remote footer is fetched with this much of the file's end

# One file's rows and encoded bytes per row group, and its columns' decoded bytes per row.
RowGroups = tuple[tuple[int, ...], tuple[int, ...], RowBytes | None]
# footer, size, groups, schema, inode and mtime
LocalFooter = tuple[pq.FileMetaData, int, RowGroups, pa.Schema, Stamp]


def row_groups(md: pq.FileMetaData) -> RowGroups:
    """A footer's rows and encoded bytes per row group, and its columns' decoded bytes per row."""
    groups = [md.row_group(i) for i in range(md.num_row_groups)]
    return (tuple(g.num_rows for g in groups), tuple(g.total_byte_size for g in groups),
            row_bytes(md))


def checked(md: pq.FileMetaData, path: str) -> pq.FileMetaData:
    """``md``, once its row groups' rows add up to the file's: a footer whose count of a row
    group was damaged lost those rows silently (found by fuzzing)."""
    rows = sum(md.row_group(i).num_rows for i in range(md.num_row_groups))
    if rows != md.num_rows:
        raise CorruptFileError(
            f"{path}: its footer counts {md.num_rows:,} rows, its row groups {rows:,}: the "
            "footer is damaged; rewrite the file or remove it from the dataset")
    return md


def tail_range(size: int) -> tuple[int, int]:
    """The range of a remote file fetched for its footer: its last 64 KiB, or all of it."""
    n = min(size, _TAIL_BYTES)
    return size - n, n


def remote_footer(store: Store, cache: Cache | None, obj: ObjectInfo) -> pq.FileMetaData:
    """A remote file's footer: one request for the file's last 64 KiB (two if the footer is
    larger), through the cache."""
    return remote_footer_and_tail(store, cache, obj)[0]


def remote_footer_and_tail(store: Store, cache: Cache | None, obj: ObjectInfo
                           ) -> tuple[pq.FileMetaData, pa.Buffer]:
    """:func:`remote_footer`, and the bytes of :func:`tail_range` it came in: the row groups
    of a small file are in them too."""
    url = store.url(obj.path)
    if obj.size < 12:
        raise CorruptFileError(f"{url}: {obj.size} bytes is too short for a Parquet file; "
                               "remove it or pass a glob that matches only Parquet files")
    r = tail_range(obj.size)
    fetched = pa.py_buffer(cached_ranges(store, cache, obj.path, obj.version, [r])[r])
    tail = fetched.to_pybytes()
    if tail[-4:] != b"PAR1":
        raise CorruptFileError(f"{url}: not a Parquet file (no PAR1 at its end); remove it "
                               "or pass a glob that matches only Parquet files")
    length = int.from_bytes(tail[-8:-4], "little") + 8
    if length > obj.size - 4:
        raise CorruptFileError(f"{url}: its footer claims {length} bytes of a {obj.size}-byte "
                               "file; the file is truncated: rewrite it or remove it")
    if length > r[1]:
        whole = (obj.size - length, length)
        tail = bytes(cached_ranges(store, cache, obj.path, obj.version, [whole])[whole])
    try:
        md = pq.read_metadata(pa.BufferReader(b"PAR1" + tail[-length:]))
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorruptFileError(f"{url}: not a readable Parquet footer ({exc}); rewrite the "
                               "file or remove it") from exc
    return checked(md, url), fetched


def read_footer(path: Path) -> tuple[pq.FileMetaData, os.stat_result]:
    """A local file's footer, and its ``stat`` taken first (a file replaced between the two
    then fails the check of its stamp at its first read, not the other way)."""
    try:
        st = path.stat()
        regular(path, st)
        md = pq.read_metadata(path)
    except PQLoaderError:
        raise
    except (pa.ArrowInvalid, OSError) as exc:
        if isinstance(exc, OSError) and (told := unreadable(path, exc)) is not None:
            raise told from exc
        raise CorruptFileError(
            f"{path}: not a readable Parquet file ({exc}); remove it or pass a glob that "
            "matches only Parquet files"
        ) from exc
    return checked(md, str(path)), st


def local_footers(paths: list[Path], skip: tuple[type[Exception], ...] = ()
                  ) -> list[LocalFooter | Exception]:
    """Each file's footer, size, row groups and Arrow schema, read in parallel by chunks;
    the error instead, for a file whose error is one of ``skip``."""
    def read(chunk: list[Path]) -> list[LocalFooter | Exception]:
        out: list[LocalFooter | Exception] = []
        for path in chunk:
            try:
                md, st = read_footer(path)
            except skip as exc:
                out.append(exc)
                continue
            out.append((md, st.st_size, row_groups(md), file_schema(md), stamp_of(st)))
        return out

    workers = max(1, min(_LOCAL_FOOTER_THREADS, len(paths)))
    n = -(-len(paths) // (workers * _LOCAL_FOOTER_CHUNKS))
    with executor(workers, "pqloader-footer") as pool:
        chunks = pool.map(read, [paths[i:i + n] for i in range(0, len(paths), n)])
        return [footer for chunk in chunks for footer in chunk]
