"""write_dataset: any table-like input, streamed into atomic, sharded Parquet files."""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from ._errors import DataError, InvalidArgumentError, check_positive
from ._manifest import write_manifest

FILE_PATTERN = "part-{:05d}.parquet"


def _pandas_batches(df: Any, chunk_rows: int) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    schema = pa.Schema.from_pandas(df, preserve_index=False)

    def gen() -> Iterator[pa.RecordBatch]:
        for start in range(0, len(df), chunk_rows):
            chunk = df.iloc[start:start + chunk_rows]
            yield from pa.Table.from_pandas(chunk, schema=schema,
                                            preserve_index=False).to_batches()

    return schema, gen()


def _check_keys(chunk: list[Any], names: frozenset[str], first_row: int) -> None:
    # pyarrow takes the columns from the first row's keys and drops other keys silently.
    for k, row in enumerate(chunk):
        if not isinstance(row, dict):
            raise DataError(f"row {first_row + k} is a {type(row).__name__}, the first rows "
                            "are dicts; give an iterable of dicts only")
        if not row.keys() <= names:
            extra = sorted(map(str, row.keys() - names))
            raise DataError(
                f"row {first_row + k} has keys {extra} that the first row lacks (it has "
                f"{sorted(names)}); give every row the same keys, or write a pyarrow Table "
                "with an explicit schema"
            )


def _dict_batches(first: dict[str, Any], rest: Iterator[Any],
                  chunk_rows: int) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    rows = itertools.chain([first], rest)
    head = list(itertools.islice(rows, chunk_rows))
    names = frozenset(first)  # as pyarrow: the columns are the first row's keys
    _check_keys(head, names, 0)
    try:
        first_table = pa.Table.from_pylist(head)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise DataError(
            f"the first {len(head)} rows do not make one table: {exc}; make every row's "
            "values of a key the same type"
        ) from exc
    schema = first_table.schema

    def gen() -> Iterator[pa.RecordBatch]:
        yield from first_table.to_batches()
        done = len(head)
        while chunk := list(itertools.islice(rows, chunk_rows)):
            _check_keys(chunk, names, done)
            try:
                table = pa.Table.from_pylist(chunk, schema=schema)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise DataError(
                    f"rows {done}..{done + len(chunk) - 1} do not fit the schema taken from "
                    f"the first rows ({schema}): {exc}; make every row's values the same type"
                ) from exc
            done += len(chunk)
            yield from table.to_batches()

    return schema, gen()


def as_batches(
    data: Any, chunk_rows: int
) -> tuple[pa.Schema, Iterator[pa.RecordBatch], int | None]:
    """Normalise any supported input to (schema, stream of record batches, rows if known)."""
    if isinstance(data, pa.Table):
        return data.schema, iter(data.to_batches(max_chunksize=chunk_rows)), data.num_rows
    if isinstance(data, pa.RecordBatch):
        return data.schema, iter([data]), data.num_rows
    if isinstance(data, pa.RecordBatchReader):
        return data.schema, iter(data), None
    module = type(data).__module__.split(".")[0]
    if module == "pandas":
        schema, batches = _pandas_batches(data, chunk_rows)
        return schema, batches, len(data)
    if module == "polars" and hasattr(data, "to_arrow"):
        return as_batches(data.to_arrow(), chunk_rows)
    if hasattr(data, "__arrow_c_stream__"):
        return as_batches(pa.RecordBatchReader.from_stream(data), chunk_rows)
    if isinstance(data, Iterable) and not isinstance(data, (str, bytes, dict)):
        it = iter(data)
        first = next(it, None)
        if first is None:
            raise InvalidArgumentError("data is empty: nothing to write")
        if isinstance(first, pa.RecordBatch):
            return first.schema, itertools.chain([first], it), None
        if isinstance(first, dict):
            schema, batches = _dict_batches(first, it, chunk_rows)
            return schema, batches, None
        raise InvalidArgumentError(
            f"an iterable of {type(first).__name__} cannot be written; give dicts or "
            "pyarrow.RecordBatch items"
        )
    raise InvalidArgumentError(
        f"cannot write a {type(data).__name__}; give a pyarrow Table, RecordBatchReader, a "
        "pandas or polars DataFrame, or an iterable of dicts or RecordBatches"
    )


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
            name = FILE_PATTERN.format(len(self.paths))
            self._tmp = self.root / f".{name}.tmp-{uuid.uuid4().hex}"
            try:
                # Page CRCs cost nothing to write and let readers detect corrupt pages
                # (ParquetDataset(verify_checksums=True)).
                self._writer = pq.ParquetWriter(self._tmp, self.schema,
                                                compression=self.compression,
                                                write_page_checksum=True)
            except (pa.ArrowException, ValueError) as exc:
                raise InvalidArgumentError(f"compression={self.compression!r}: {exc}") from exc

    def finish_file(self) -> None:
        if self._writer is None or self._tmp is None:
            return
        self._writer.close()
        final = self.root / FILE_PATTERN.format(len(self.paths))
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
    row_group_size: int = 65_536,
    compression: str = "snappy",
    overwrite: bool = False,
    progress: bool | None = None,
) -> list[str]:
    """Write ``data`` as a sharded Parquet dataset, streaming, one file at a time.

    Args:
        data: a pyarrow Table, RecordBatch or RecordBatchReader, a pandas or polars DataFrame,
            or an iterable of dicts or RecordBatches. Never held whole in memory by this
            function: at most one row group is buffered.
        path: the directory to create or fill; files are ``part-00000.parquet``, ...
        rows_per_file: rows in each file (the last may hold fewer).
        row_group_size: rows in each row group, the unit of reading and shuffling.
        compression: any codec pyarrow knows ("snappy", "zstd", "none", ...).
        overwrite: replace the ``part-*.parquet`` files already in ``path``, once the new
            ones are complete (a failure leaves the old dataset whole); otherwise a directory
            holding data files is refused.
        progress: show a tqdm bar; default: when stderr is a terminal.

    Returns:
        The paths written. Each file appears under its final name only once complete.
    """
    check_positive("rows_per_file", rows_per_file)
    check_positive("row_group_size", row_group_size)
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise InvalidArgumentError(f"{root}: exists and is not a directory")
    root.mkdir(parents=True, exist_ok=True)
    existing = sorted(p for p in root.iterdir() if not p.name.startswith(("_", ".")))
    if existing and not overwrite:
        raise InvalidArgumentError(
            f"{root}: already holds {len(existing)} files (e.g. {existing[0].name}); pass "
            "overwrite=True or choose an empty directory"
        )
    foreign = [p for p in existing if not (p.is_file() and p.match("part-*.parquet"))]
    if foreign:
        raise InvalidArgumentError(
            f"{root}: overwrite=True replaces only part-*.parquet files, but {foreign[0].name} "
            "is there too and would be read as data; remove it or choose another directory"
        )
    # Replacing a dataset: the new files are written aside and swapped in at the end, so a
    # failure half-way leaves the old dataset whole.
    staging = root / f".pqloader-staging-{uuid.uuid4().hex}" if existing else root
    staging.mkdir(exist_ok=True)
    try:
        paths = _write_files(data, root, staging, rows_per_file=rows_per_file,
                             row_group_size=row_group_size, compression=compression,
                             progress=progress)
        if staging != root:
            for p in existing:
                p.unlink()
            paths = [str(Path(p).replace(root / Path(p).name)) for p in paths]
        write_manifest(root, paths)  # opening the dataset then reads no footer
    finally:
        if staging != root:
            shutil.rmtree(staging, ignore_errors=True)
    return paths


def _write_files(data: Any, root: Path, staging: Path, *, rows_per_file: int,
                 row_group_size: int, compression: str, progress: bool | None) -> list[str]:
    schema, batches, total = as_batches(data, row_group_size)
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
            writer.write(table.slice(0, n).combine_chunks())
            rest = table.slice(n)
            buffered, buffered_rows = rest.to_batches(), rest.num_rows
            bar.update(n)
            if writer.rows_in_file >= rows_per_file:
                writer.finish_file()

    try:
        for batch in batches:
            if not batch.schema.equals(schema):
                try:
                    batch = batch.cast(schema)
                except (pa.ArrowInvalid, pa.ArrowTypeError, NotImplementedError) as exc:
                    raise DataError(
                        f"a record batch has schema {batch.schema}, the first had {schema}: "
                        f"{exc}"
                    ) from exc
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
