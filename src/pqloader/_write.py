"""write_dataset: any table-like input, streamed into atomic, sharded Parquet files."""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from ._errors import DataError, InvalidArgumentError, check_positive
from ._inputs import as_batches, conform
from ._manifest import INCOMPLETE, write_manifest
from ._writing import STAGING_PREFIX, TMP_INFIX, remove_leftovers, writing


def file_name(index: int) -> str:
    """``part-00000.parquet``..., in the input's order when sorted by name, as datasets are
    read: past 99,999 files a "z" for each digit more (``part-10000`` sorted after
    ``part-100000`` and before ``part-10001``, found in review)."""
    return f"part-{'z' * max(0, len(str(index)) - 5)}{index:05d}.parquet"


ROW_GROUP_ROWS = 65_536  # write_dataset's row groups by default: this many rows at most,
ROW_GROUP_BYTES = 16 * 2**20  # and at most this many bytes decoded (a quarter of a window)

_MARKER_TEXT = ("pqloader.write_dataset is writing this folder, or failed or was stopped while "
                "it did: its files are not the whole dataset. pqloader refuses to open the "
                "folder while this file is here.\n")


def _combined(group: pa.Table) -> pa.Table:
    """A row group's rows in one chunk a column, or the DataError naming a dictionary column
    whose batches' dictionaries together hold more values than its indices number (pandas
    categoricals of int8 codes from two sources: pyarrow's own write_table fails too)."""
    for f in group.schema:  # pyarrow can neither combine nor write them (its bare errors
        # blamed the indices' width, or named nothing: found by a round-trip fuzzer)
        if pa.types.is_dictionary(f.type) and any(
                chunk.dictionary.null_count for chunk in group.column(f.name).chunks):
            raise DataError(
                f"column {f.name!r} ({f.type}): its dictionary holds a null value, which "
                "Parquet writers do not write (a null is an index's); hold the nulls in the "
                "indices instead: column.dictionary_decode().dictionary_encode()")
    try:
        return group.combine_chunks()
    except pa.ArrowInvalid as exc:
        f = next((f for f in group.schema if pa.types.is_dictionary(f.type)
                  and f.type.index_type.bit_width < 32 and not _combines(group.column(f.name))),
                 None)  # (the one that fails: the first narrow one was blamed, found in review)
        if f is None:
            raise
        raise DataError(
            f"column {f.name!r} ({f.type}): its batches' dictionaries together hold more "
            f"values than {f.type.index_type} indices number, and a row group holds them all "
            f"({exc}); cast it to a dictionary of int32 indices (pa.dictionary(pa.int32(), "
            "its values' type)) first (a pandas categorical: give every frame the same "
            "categories), or pass a row_group_size= no larger than a batch") from exc


def _combines(column: pa.ChunkedArray) -> bool:
    try:
        column.combine_chunks()
    except pa.ArrowInvalid:
        return False
    return True


class _ShardWriter:
    """Writes row groups into numbered files, each appearing only once complete."""

    def __init__(self, root: Path, schema: pa.Schema, compression: str) -> None:
        self.root, self.schema, self.compression = root, schema, compression
        self.paths: list[str] = []
        self._writer: pq.ParquetWriter | None = None
        self._tmp: Path | None = None
        self.rows_in_file = 0

    def write(self, table: pa.Table) -> None:
        self.open()
        assert self._writer is not None
        self._writer.write_table(table, row_group_size=max(1, table.num_rows))
        self.rows_in_file += table.num_rows

    def open(self) -> None:
        if self._writer is None:
            name = file_name(len(self.paths))
            self._tmp = self.root / f".{name}{TMP_INFIX}{uuid.uuid4().hex}"
            try:
                # Page CRCs cost nothing to write and let readers detect corrupt pages
                # (ParquetDataset(verify_checksums=True)).
                self._writer = pq.ParquetWriter(self._tmp, self.schema,
                                                compression=self.compression,
                                                write_page_checksum=True)
            except (pa.ArrowException, ValueError) as exc:
                if "compression" in str(exc).lower() or "codec" in str(exc).lower():
                    raise InvalidArgumentError(
                        f"compression={self.compression!r}: {exc}") from exc
                raise DataError(f"the input's schema cannot be written to Parquet: {exc}; "
                                "change that column's type, or leave it out") from exc  # (an
                # empty struct was blamed on compression=, found by fuzzing)

    def finish_file(self) -> None:
        if self._writer is None or self._tmp is None:
            return
        self._writer.close()
        final = self.root / file_name(len(self.paths))
        os.replace(self._tmp, final)
        self.paths.append(str(final))
        self._writer, self._tmp, self.rows_in_file = None, None, 0

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)


def write_dataset(
    data: Any,
    path: str | os.PathLike[str],
    *,
    rows_per_file: int = 1_000_000,
    row_group_size: int | None = None,
    compression: str = "snappy",
    overwrite: bool = False,
    progress: bool | None = None,
    schema: pa.Schema | None = None,
) -> list[str]:
    """Write ``data`` as a sharded Parquet dataset, streaming, one file at a time.

    Args:
        data: a pyarrow Table, RecordBatch or RecordBatchReader, a pandas or polars DataFrame,
            or an iterable of dicts or RecordBatches. Never held whole in memory by this
            function: at most one row group is buffered. A DataFrame's named index levels
            become columns; an unnamed index (a position, as ``df[df.x > 0]`` leaves) does
            not. Later dicts and batches must fit the first ones' types (a DataError names the
            rows and column that do not): values are never changed on the way.
        path: the directory to create or fill; files are ``part-00000.parquet``, ...
        rows_per_file: rows in each file (the last may hold fewer).
        row_group_size: rows in each row group, the unit of reading and shuffling; default:
            65,536, or fewer where that many rows decode to more than 16 MiB (images, long
            texts), so that a shuffle window (~64 MiB) mixes several row groups: with one
            row group a window, a shuffle only permutes rows within each.
        compression: any codec pyarrow knows ("snappy", "zstd", "none", ...).
        overwrite: replace the ``part-*.parquet`` files already in ``path``, once the new
            ones are complete (a failure leaves the old dataset whole); otherwise a directory
            holding data files is refused.
        progress: show a tqdm bar; default: when stderr is a terminal.
        schema: the columns and their types (``pyarrow.Schema``); default: the input's, or
            for dicts and record batches the first ones'. Give it when the first rows
            cannot tell (a key that is None in all of them is typed ``null`` and holds no
            later value). Each batch is matched to it by column name, and its types changed
            only within their kind of value: a value that would change (text parsed as a
            number, a float rounded into a decimal) is a DataError naming the column. Floats
            are rounded into narrower ones only here (a later batch's doubles into the first
            batch's floats must stay exactly what they are).

    Returns:
        The paths written. Each file appears under its final name only once complete. Until
        the whole dataset is, ``path/_pqloader_incomplete`` says so: left by a failure or a
        kill beside the files finished, it makes :class:`ParquetDataset` refuse the folder
        (:class:`pqloader.CorruptFileError`) rather than read part of the rows. The next
        write into the folder that succeeds removes a killed write's hidden temporary files;
        a second write into it while one runs raises :class:`pqloader.InvalidArgumentError`.
    """
    check_positive("rows_per_file", rows_per_file)
    if row_group_size is not None:
        check_positive("row_group_size", row_group_size)
    if "://" in str(path) and not str(path).startswith("file://"):
        raise InvalidArgumentError(f"{path}: write_dataset writes to a local folder; write "
                                   "there, then copy the folder to the store")
    root = Path(str(path).removeprefix("file://"))
    if root.exists() and not root.is_dir():
        raise InvalidArgumentError(f"{root}: exists and is not a directory")
    created = [p for p in (root, *root.parents) if not p.exists()]  # deepest first
    root.mkdir(parents=True, exist_ok=True)
    try:
        with writing(root) as locked:
            paths = _write_into(root, data, overwrite=overwrite, rows_per_file=rows_per_file,
                                row_group_size=row_group_size, compression=compression,
                                progress=progress, schema=schema)
            if locked:
                remove_leftovers(root)
            return paths
    except BaseException:
        for folder in created:  # a failure leaves no empty folder this call made
            try:
                folder.rmdir()  # refuses a folder that is not empty: finished files stay
            except OSError:
                break
        raise


def _write_into(root: Path, data: Any, *, overwrite: bool, rows_per_file: int,
                row_group_size: int | None, compression: str, progress: bool | None,
                schema: pa.Schema | None) -> list[str]:
    """write_dataset's work in ``root``, made and locked."""
    existing = sorted(p for p in root.iterdir() if not p.name.startswith(("_", ".")))
    foreign = [p for p in existing if not (p.is_file() and p.match("part-*.parquet"))]
    if existing and not overwrite:
        held = f"{len(existing)} file{'s' * (len(existing) != 1)}"
        what = f"remove {foreign[0].name} or " if foreign else "pass overwrite=True or "
        raise InvalidArgumentError(  # overwrite=True replaces a dataset, nothing else
            f"{root}: already holds {held} (e.g. {(foreign or existing)[0].name}); {what}"
            "choose an empty directory")
    if foreign:
        raise InvalidArgumentError(
            f"{root}: overwrite=True replaces only part-*.parquet files, but {foreign[0].name} "
            "is there too and would be read as data; remove it or choose another directory"
        )
    # Replacing a dataset: the new files are written aside and swapped in at the end, so a
    # failure half-way leaves the old dataset whole.
    staging = root / f"{STAGING_PREFIX}{uuid.uuid4().hex}" if existing else root
    staging.mkdir(exist_ok=True)
    # While files appear in root, a marker says the folder is not a dataset yet: left by a
    # failure or a kill, it makes opening the folder an error, not a dataset short of rows.
    marker = root / INCOMPLETE
    if staging == root:
        _mark(marker)
    swapping = False  # old files going, new ones coming: a failure keeps both the marker and
    try:  # the staged files (the new dataset, whole, for whoever picks up the pieces)
        paths = _write_files(data, root, staging, rows_per_file=rows_per_file,
                             row_group_size=row_group_size, compression=compression,
                             progress=progress, schema=schema)
        if staging != root:
            _mark(marker)
            swapping = True
            for p in existing:
                p.unlink()
            paths = [str(Path(p).replace(root / Path(p).name)) for p in paths]
        write_manifest(root, paths)  # opening the dataset then reads no footer
        marker.unlink()
        swapping = False
    except BaseException:
        if not swapping and not any(root.glob("part-*.parquet")):
            marker.unlink(missing_ok=True)  # nothing written: nothing to warn of
        raise
    finally:
        if staging != root and not swapping:
            shutil.rmtree(staging, ignore_errors=True)
    return paths


def _mark(marker: Path) -> None:
    """Write the marker, or none: one left half-written by a full disk before any file was
    swapped made the old dataset, whole, an error to open (found in review). One an earlier
    failed write left stays (its staged files may be the only copy of the new dataset)."""
    there = marker.exists()
    try:
        marker.write_text(_MARKER_TEXT)
    except BaseException:
        if not there:
            marker.unlink(missing_ok=True)
        raise


def decoded_bytes(table: pa.Table) -> int:
    """A row group's bytes as read back: a dictionary column's values once a row, by their
    mean size (each slice of it holds the whole dictionary: 20 MiB of categories made the
    16 MiB cap cut row groups down to one row, and tripled the file; found in review)."""
    total = 0
    for column in table.columns:
        for chunk in column.chunks:
            if pa.types.is_dictionary(chunk.type):
                values = chunk.dictionary
                total += chunk.indices.nbytes + values.nbytes * len(chunk) // max(1, len(values))
            else:
                total += chunk.nbytes
    return total


def _write_files(data: Any, root: Path, staging: Path, *, rows_per_file: int,
                 row_group_size: int | None, compression: str, progress: bool | None,
                 schema: pa.Schema | None) -> list[str]:
    capped = row_group_size is None  # the default: rows, and at most ROW_GROUP_BYTES
    row_group_size = ROW_GROUP_ROWS if row_group_size is None else row_group_size
    asked = schema is not None
    whose = "schema= has" if asked else "the first had"
    schema, batches, total = as_batches(data, row_group_size, schema,
                                        ROW_GROUP_BYTES if capped else None)
    if not len(schema):  # its batches hold rows but no column: their files never filled up
        raise DataError("the input has no column; give it at least one")
    twice = sorted({n for n in schema.names if schema.names.count(n) > 1})
    if twice:  # written, such files could not be read back by name (pqloader, pandas, Spark)
        raise DataError(f"column {twice[0]!r} appears twice in the input; give each column a "
                        "name of its own")
    schema = schema.remove_metadata() if schema.metadata and b"pandas" not in schema.metadata \
        else schema
    writer = _ShardWriter(staging, schema, compression)
    show = sys.stderr.isatty() if progress is None else progress
    bar = tqdm(total=total, unit="rows", unit_scale=True, disable=not show,
               desc=f"writing {root.name}")
    buffered: list[pa.RecordBatch] = []
    buffered_rows = 0

    def flush(final: bool) -> None:
        nonlocal buffered, buffered_rows
        while buffered_rows and (final or buffered_rows >= row_group_size):
            n = min(row_group_size, rows_per_file - writer.rows_in_file, buffered_rows)
            table = pa.Table.from_batches(buffered, schema=schema)
            group = table.slice(0, n)
            if capped:  # cut again while still over: rows of unequal sizes (found in review)
                while n > 1 and (size := decoded_bytes(group)) > ROW_GROUP_BYTES:
                    n = max(1, n * ROW_GROUP_BYTES // size)
                    group = table.slice(0, n)
            writer.write(_combined(group))
            rest = table.slice(n)
            buffered, buffered_rows = rest.to_batches(), rest.num_rows
            bar.update(n)
            if writer.rows_in_file >= rows_per_file:
                writer.finish_file()

    try:
        for number, batch in enumerate(batches):
            if not batch.schema.equals(schema):
                batch = conform(batch, schema, number, whose, asked=asked)
            buffered.append(batch)
            buffered_rows += batch.num_rows
            flush(final=False)
        flush(final=True)
        if not writer.paths:
            writer.open()  # no rows: one file that still carries the schema
        writer.finish_file()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
    return writer.paths
