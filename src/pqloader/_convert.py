"""The sources ``pqloader write`` reads: CSV, JSON Lines or a Parquet dataset, as Arrow batches."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

import pqloader

FORMATS = ("csv", "jsonl", "parquet")
CODECS = ("none", "snappy", "gzip", "brotli", "lz4", "zstd")
_EXTENSIONS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
               ".parquet": "parquet"}
_COMPRESSED = (".gz", ".bz2", ".zst", ".lz4")  # pyarrow decompresses these by extension
HINTS = {"csv": "CSV column types are guessed from the first rows; make later values fit them",
         "jsonl": "JSON Lines expected: one object per line, with the same keys and types",
         "parquet": "the file may be truncated or corrupt"}


class CommandFailure(Exception):
    """A failure to report as ``pqloader: <message>``; ``code`` 2 means bad usage."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def guess_format(source: str) -> str:
    """``'csv'``, ``'jsonl'`` or ``'parquet'`` from the extension; a directory is Parquet."""
    path = Path(source)
    if path.is_dir():
        return "parquet"
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in _COMPRESSED:
        suffixes.pop()
    fmt = _EXTENSIONS.get(suffixes[-1]) if suffixes else None
    if fmt is None:
        raise CommandFailure(f"{source}: cannot tell the format from the name; pass "
                             f"--format {{{','.join(FORMATS)}}}", code=2)
    return fmt


def _parquet_batches(source: str) -> tuple[pa.Schema, Iterator[pa.RecordBatch], list[str]]:
    """The dataset's batches file by file, hive partition columns put back from the paths."""
    ds = pqloader.ParquetDataset(source)  # checks every footer and the schema before writing
    schema, root = ds.schema, Path(source)

    def gen() -> Iterator[pa.RecordBatch]:
        for path in ds.files:
            parts: dict[str, str | None] = {}
            for part in Path(path).relative_to(root).parent.parts if root.is_dir() else ():
                key, _, value = part.partition("=")
                value = unquote(value)
                parts[key] = None if value == "__HIVE_DEFAULT_PARTITION__" else value
            try:
                for batch in pq.ParquetFile(path).iter_batches():
                    arrays = [pa.array([parts[f.name]] * batch.num_rows, pa.string())
                              if f.name in parts else batch.column(f.name) for f in schema]
                    yield pa.RecordBatch.from_arrays(
                        [a if a.type.equals(f.type) else a.cast(f.type)
                         for a, f in zip(arrays, schema, strict=True)], schema=schema)
            except (pa.ArrowException, OSError) as exc:
                raise CommandFailure(f"{path}: {exc}; {HINTS['parquet']}") from exc

    return schema, gen(), ds.files


_BLOCK = 16 << 20


def open_source(source: str, fmt: str) -> tuple[pa.Schema, Iterator[pa.RecordBatch], list[str]]:
    if fmt == "parquet":
        return _parquet_batches(source)
    if not Path(source).is_file():
        raise CommandFailure(f"{source}: no such file (a {fmt} source is one file); "
                             "check the path")
    # Blocks of 16 MiB, not pyarrow's 1 MiB: a field or a line up to that size reads (a ~3 MB
    # one failed, "straddles two block boundaries"), and column types are guessed from more rows
    if fmt == "csv":
        reader = pa_csv.open_csv(source, read_options=pa_csv.ReadOptions(block_size=_BLOCK))
    elif hasattr(pa_json, "open_json"):
        reader = pa_json.open_json(source, read_options=pa_json.ReadOptions(block_size=_BLOCK))
    else:  # pyarrow < 19 has no streaming JSON reader: the file is read whole
        reader = pa_json.read_json(source).to_reader()
    return reader.schema, iter(reader), [source]


def counted(batches: Iterator[pa.RecordBatch], source: str, fmt: str,
             rows: list[int]) -> Iterator[pa.RecordBatch]:
    """Pass batches through, counting rows; a read error names the file it came from."""
    try:
        for batch in batches:
            for column in batch.columns:  # invalid UTF-8 in a string column, caught here:
                if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                    column.validate(full=True)  # written, it fails every read after
            rows[0] += batch.num_rows
            yield batch
    except (pa.ArrowException, OSError) as exc:
        raise CommandFailure(f"{source}: {exc}; {HINTS[fmt]}") from exc


