"""Sources to fragments: their files (``_sources.py``), every footer read in parallel
(``_footers.py``), one fragment index and one schema."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar, cast
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ._cache import Cache
from ._errors import (
    ColumnNotFoundError,
    CorruptFileError,
    DatasetNotFoundError,
    EmptyDatasetError,
    InvalidArgumentError,
    PermissionDeniedError,
    SchemaMismatchError,
)
from ._fetch import cached_ranges
from ._filter import RowFilter
from ._footers import (
    LocalFooter,
    RowGroups,
    local_footers,
    read_footer,
    remote_footer,
    row_groups,
)
from ._fs import ObjectInfo, Store
from ._int96 import file_schema
from ._manifest import match_manifest, read_manifest
from ._schema import hive_partition, partition_schema, typed_first, unify
from ._signed import redact
from ._sizes import RowBytes, file_rows, fragments_bytes
from ._sources import expand_source, list_remote
from ._stamps import Stamp
from ._threads import executor
from ._views import unviewed
from ._widen import common_number, widened_bytes

_MAX_FOOTER_THREADS = 32
T = TypeVar("T")


@dataclass(frozen=True)
class FileEntry:
    """One Parquet file: where it is, its footer and its hive partition values."""

    path: str
    metadata: pq.FileMetaData | None  # None when opened from a manifest: read when needed
    size_bytes: int
    partition: tuple[tuple[str, str | None], ...] = ()
    version: str | None = None  # a remote object's ETag or mtime: the cache's key
    stamp: Stamp | None = None  # a local file's inode and mtime when opened (_read checks)


@dataclass(frozen=True)
class Discovery:
    """What opening a source found: files, the fragment index and one schema."""

    files: tuple[FileEntry, ...]
    schema: pa.Schema  # projected, partition columns last
    partition_schema: pa.Schema  # the hive partition columns (typed), possibly empty
    # The fragment index: one entry a non-empty row group, in file then row-group order.
    file_index: np.ndarray  # int32
    row_group: np.ndarray  # int32
    num_rows: np.ndarray  # int64
    byte_size: np.ndarray  # int64, uncompressed bytes of the whole row group
    store: Store | None = None  # where remote files are read from; None for local files
    cache: Cache | None = None  # the local cache of remote bytes
    # filter=: the rows read (_filter.py); num_rows counts them once _kept.py has
    filter: RowFilter | None = None
    # int64, what a read of each fragment holds before a filter keeps its rows (the whole row
    # group decoded, the filter's columns too): byte_size, unless a filter reads more, or made
    # byte_size the kept rows' share
    read_bytes: np.ndarray | None = None
    # per file: its columns of numbers read wider than stored, and how many times their bytes
    # grow (_widen.py); empty where none is (a manifest's dataset, files of one schema)
    widened: tuple[dict[str, float], ...] = ()
    # (file, why) of each file on_bad_file="skip" left out
    skipped: tuple[tuple[str, str], ...] = ()

    def held(self) -> np.ndarray:
        """Bytes a read of each fragment holds at once (decoded, before any filter)."""
        return self.byte_size if self.read_bytes is None else self.read_bytes

    def where(self, fragment: int) -> str:
        """A fragment as errors name it: its file and row group."""
        path = redact(self.files[int(self.file_index[fragment])].path)
        return f"{path}: row group {int(self.row_group[fragment])}"


def read_footers(entries: Sequence[FileEntry], store: Store | None = None,
                 cache: Cache | None = None) -> list[pq.FileMetaData]:
    """Every file's footer: the known ones, the others read in parallel."""
    missing = [e for e in entries if e.metadata is None]

    def read(e: FileEntry) -> pq.FileMetaData:
        if store is None:
            return read_footer(Path(e.path))[0]
        return remote_footer(store, cache, ObjectInfo(store.native(e.path), e.size_bytes,
                                                      e.version))

    workers = max(1, min(_MAX_FOOTER_THREADS, len(missing)))
    with executor(workers, "pqloader-footer") as pool:
        found = iter(list(pool.map(read, missing)))
    return [e.metadata if e.metadata is not None else next(found) for e in entries]


Groups = list[RowGroups]  # per file


# What on_bad_file="skip" leaves out: a file whose footer cannot be read, for good (not
# Parquet, truncated, empty; not readable by this process; a broken link). Not a remote read
# that failed after its retries: the next opening may read it.
SKIPPED_LOCAL = (CorruptFileError, PermissionDeniedError, DatasetNotFoundError)
SKIPPED_REMOTE = (CorruptFileError,)


def discover(source: object, columns: Sequence[str] | None = None, *, filter: Any = None,
             store: Store | None = None, cache: Cache | None = None,
             skip: bool = False) -> Discovery:
    """Open a source: list its files, read their footers in parallel, build the index.

    ``store`` is given for remote sources (URLs, or a user's filesystem); its footers and
    data go through ``cache`` when one is given. A ``filter`` is checked against the columns
    and kept in the index; its rows are not counted here (no data is read here). ``skip``:
    files whose footer cannot be read are left out, as ``Discovery.skipped`` says.
    """
    if store is None:
        entries, schemas, groups, skipped = _open_local(source, skip)
    else:
        entries, schemas, groups, skipped = _open_remote(source, store, cache, skip)
    if skipped and not entries:
        raise EmptyDatasetError(f"{source}: every file was skipped (on_bad_file='skip'); the "
                                f"first: {skipped[0][1]}")
    return replace(_index(entries, schemas, groups, columns, filter, store, cache),
                   skipped=tuple(skipped))


def _footers_kept(names: list[str], footers: Sequence[T | Exception]
                  ) -> tuple[list[int], list[tuple[str, str]]]:
    """The indices of the files whose footers were read, and (name, error) of the others."""
    kept = [k for k, f in enumerate(footers) if not isinstance(f, Exception)]
    return kept, [(names[k], str(f)) for k, f in enumerate(footers) if isinstance(f, Exception)]


def _open_local(source: object, skip: bool = False) -> tuple[
        list[FileEntry], list[tuple[str, pa.Schema]], Groups, list[tuple[str, str]]]:
    paths, root = expand_source(source)
    # absolute: a dataset opened by a relative path read nothing once the working folder
    # changed (os.chdir, some launchers do), found in review
    paths = [p if p.is_absolute() else p.absolute() for p in paths]
    if root is not None and not root.is_absolute():
        root = root.absolute()
    manifest = read_manifest(root, paths) if root is not None else None
    groups: Groups
    if manifest is not None:
        entries = [FileEntry(str(f.path), None, f.size_bytes, hive_partition(f.path, root),
                             stamp=f.stamp) for f in manifest.files]
        schemas = [(entries[0].path, manifest.schema)]
        groups = [(f.row_group_rows, f.row_group_bytes, f.row_bytes) for f in manifest.files]
        return entries, schemas, groups, []
    read = local_footers(paths, SKIPPED_LOCAL if skip else ())
    kept, skipped = _footers_kept([str(p) for p in paths], read)
    footers = [cast(LocalFooter, read[k]) for k in kept]
    entries = [
        FileEntry(str(p), md, size, hive_partition(p, root), stamp=stamp)
        for p, (md, size, _, _, stamp) in zip([paths[k] for k in kept], footers, strict=True)
    ]
    schemas = [(e.path, f[3]) for e, f in zip(entries, footers, strict=True)]
    return entries, schemas, [f[2] for f in footers], skipped


def _open_remote(source: object, store: Store, cache: Cache | None, skip: bool = False
                 ) -> tuple[list[FileEntry], list[tuple[str, pa.Schema]], Groups,
                            list[tuple[str, str]]]:
    objects, root, manifest_obj = list_remote(source, store)
    if any(o.size <= 0 for o in objects):  # listings without sizes (HTTP): ask each object
        with executor(min(_MAX_FOOTER_THREADS, len(objects)), "pqloader-list") as pool:
            objects = list(pool.map(lambda o: o if o.size > 0 else store.info(o.path), objects))
            if manifest_obj is not None and manifest_obj.size <= 0:  # else read as empty
                manifest_obj = store.info(manifest_obj.path)
    # URLs of HTTP listings arrive percent-encoded ('part%3D0'): decode them once first.
    plain = unquote if store.protocol in ("http", "https") else str
    parts = [hive_partition(PurePosixPath(plain(o.path)), None if root is None else
                             PurePosixPath(plain(root))) for o in objects]
    if manifest_obj is not None and root is not None:
        url = store.url(manifest_obj.path)
        whole = (0, manifest_obj.size)  # cached like data: keyed by its version, never stale
        text = bytes(cached_ranges(store, cache, manifest_obj.path, manifest_obj.version,
                                   [whole])[whole]).decode("utf-8", "replace")
        by_name = {o.path[len(root) + 1:]: o for o in objects}
        manifest = match_manifest(text, url, {n: o.size for n, o in by_name.items()},
                                  lambda name: name)
        if manifest is not None:
            entries = [FileEntry(store.url(o.path), None, o.size, part, o.version)
                       for o, part in zip(objects, parts, strict=True)]
            groups = [(f.row_group_rows, f.row_group_bytes, f.row_bytes)
                      for f in manifest.files]
            return entries, [(entries[0].path, manifest.schema)], groups, []

    skipping = SKIPPED_REMOTE if skip else ()

    def footer(o: ObjectInfo) -> pq.FileMetaData | Exception:
        try:
            return remote_footer(store, cache, o)
        except skipping as exc:
            return exc

    workers = max(1, min(_MAX_FOOTER_THREADS, len(objects)))
    with executor(workers, "pqloader-footer") as pool:
        read = list(pool.map(footer, objects))
    kept, skipped = _footers_kept([store.url(o.path) for o in objects], read)
    footers = [cast(pq.FileMetaData, read[k]) for k in kept]
    entries = [FileEntry(store.url(o.path), md, o.size, part, o.version) for o, md, part in
               zip([objects[k] for k in kept], footers, [parts[k] for k in kept], strict=True)]
    schemas = [(e.path, file_schema(md)) for e, md in zip(entries, footers, strict=True)]
    return entries, schemas, [row_groups(md) for md in footers], skipped


def widen_row_bytes(per_row: RowBytes | None, ratios: dict[str, float]) -> RowBytes | None:
    """A file's decoded bytes per row of each column (``_sizes.row_bytes``), those it stores
    narrower than the dataset reads them (``ratios``, from :func:`_widened`) grown so."""
    if per_row is None or not ratios:
        return per_row
    return {c: b * ratios.get(c, 1.0) for c, b in per_row.items()}


def _widened(schemas: list[tuple[str, pa.Schema]], schema: pa.Schema, files: int
             ) -> list[dict[str, float]]:
    """Per file, its columns of numbers the dataset reads in a wider type (``_widen.py``), and
    how many times their bytes grow: a window sized by the stored width held twice its share."""
    if len(schemas) != files or all(s.equals(schemas[0][1]) for _, s in schemas[1:]):
        return [{}] * files  # one schema (a manifest's, or every file's alike): none widened
    numbers = [f for f in schema if common_number(f.type, f.type) is not None
               or f.type.num_fields]  # (lists, structs and maps of numbers)
    out: list[dict[str, float]] = []
    for _, file_schema_ in schemas:
        ratios = {}
        for field in numbers:
            i = file_schema_.get_field_index(field.name)
            if i >= 0 and (ratio := widened_bytes(field.type, file_schema_.field(i).type)) > 1:
                ratios[field.name] = ratio
        out.append(ratios)
    return out


def read_columns(names: list[str], row_filter: RowFilter | None,
                 partitions: list[str]) -> list[str]:
    """The columns a read decodes: the projection's, and the filter's that it lacks."""
    if row_filter is None:
        return names
    return [*names, *(c for c in row_filter.columns if c not in names and c not in partitions)]


def _index(entries: list[FileEntry], schemas: list[tuple[str, pa.Schema]], groups: Groups,
           columns: Sequence[str] | None, filter: Any, store: Store | None, cache: Cache | None
           ) -> Discovery:
    """The fragment index and the unified, projected schema of opened files."""
    schemas = [(path, unviewed(s)) for path, s in schemas]  # as _read.py reads them
    part_schema = partition_schema(entries)
    if columns is not None:
        columns = list(columns)
        if not columns or not all(isinstance(c, str) for c in columns):
            raise InvalidArgumentError(
                f"columns={columns!r}: pass a non-empty list of column names, or None for all")
        if len(set(columns)) != len(columns):
            raise ColumnNotFoundError(f"columns={columns} names a column twice")
        file_cols = [c for c in columns if c not in part_schema.names]
    else:
        file_cols = None
    for field in part_schema:  # every file's columns, not only the projected ones
        clash = next((path for path, s in schemas if s.get_all_field_indices(field.name)),
                     None)
        if clash is not None:
            raise SchemaMismatchError(
                f"column {field.name!r} is both a hive partition folder and a column in "
                f"{clash}; rename one of them"
            )
    row_filter = None
    if filter is not None:  # every file holds the first's columns, or unify says which lacks
        row_filter = RowFilter.of(filter, pa.schema([*typed_first(schemas), *part_schema]),
                                  f"{schemas[0][0]} (the first file)")
        if file_cols is not None:  # the filter's columns are read and unified, not shown
            file_cols += [c for c in row_filter.columns
                          if c not in file_cols and c not in part_schema.names]
    schema = unify(schemas, file_cols, part_schema.names)
    wanted = columns if columns is not None else [*schema.names, *part_schema.names]
    full = pa.schema([*schema, *part_schema])
    schema = pa.schema([full.field(n) for n in wanted])
    if row_filter is not None:  # bound anew to the unified types (a column nullable in some
        # file; an int column that other files give as float64: its NaN rows then count)
        row_filter = RowFilter.of(filter, full, f"{schemas[0][0]} (the first file)")

    file_index, row_group, num_rows, byte_size, read_bytes = [], [], [], [], []
    read = read_columns(schema.names, row_filter, part_schema.names)
    widened = _widened(schemas, full, len(groups))
    for i, (rows, sizes, per_row) in enumerate(groups):
        per_row = widen_row_bytes(per_row, widened[i])
        n, encoded = np.asarray(rows, np.int64), np.asarray(sizes, np.int64)
        kept = np.flatnonzero(n)  # a row group of no rows is no fragment
        n, encoded = n[kept], encoded[kept]
        file_index.append(np.full(len(kept), i, np.int32))
        row_group.append(kept.astype(np.int32))
        num_rows.append(n)
        byte_size.append(fragments_bytes(n, file_rows(per_row, schema.names), encoded))
        if read != schema.names:
            read_bytes.append(fragments_bytes(n, file_rows(per_row, read), encoded))

    def joined(parts: list[np.ndarray], dtype: type) -> np.ndarray:
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

    return Discovery(
        files=tuple(entries),
        schema=schema,
        partition_schema=part_schema,
        file_index=joined(file_index, np.int32),
        row_group=joined(row_group, np.int32),
        num_rows=joined(num_rows, np.int64),
        byte_size=joined(byte_size, np.int64),
        read_bytes=joined(read_bytes, np.int64) if any(len(p) for p in read_bytes) else None,
        widened=tuple(widened) if any(widened) else (),
        store=store,
        cache=cache,
        filter=row_filter,
    )
