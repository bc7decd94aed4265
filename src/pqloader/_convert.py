"""The sources ``pqloader write`` reads: CSV, JSON Lines or a Parquet dataset, as Arrow batches."""

from __future__ import annotations

import argparse
import codecs
import itertools
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import numpy as np
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


def column_type(text: str) -> tuple[str, pa.DataType]:
    """``--column-type NAME=TYPE``: a column and a pyarrow type name (int64, uint64, string...)."""
    name, sep, alias = text.rpartition("=")
    try:
        if not sep or not name:
            raise ValueError("expected NAME=TYPE")
        return name, pa.type_for_alias(alias.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r}: {exc}; TYPE is a pyarrow type name such as int64, uint64, float64, "
            "string, bool, date32 or timestamp[ms]") from None


def open_source(source: str, fmt: str, column_types: dict[str, pa.DataType] | None = None,
                encoding: str | None = None
                ) -> tuple[pa.Schema, Iterator[pa.RecordBatch], list[str]]:
    """The source's schema, its batches and the files they come from.

    CSV and JSON Lines have no types: pyarrow guesses them from the first block, and
    ``column_types`` sets those the guess gets wrong (:func:`check_guessed` names them).
    """
    types = dict(column_types or {})
    if fmt == "parquet":
        if types or encoding:
            raise CommandFailure("--column-type and --encoding are for CSV and JSON Lines; a "
                                 "Parquet source has its types and encoding", code=2)
        return _parquet_batches(source)
    if not Path(source).is_file():
        raise CommandFailure(f"{source}: no such file (a {fmt} source is one file); "
                             "check the path")
    if encoding is not None:
        try:
            codecs.lookup(encoding)
        except LookupError:
            raise CommandFailure(f"--encoding {encoding}: no such text encoding; try utf8, "
                                 "latin-1 or cp1252", code=2) from None
    # Blocks of 16 MiB, not pyarrow's 1 MiB: a field or a line up to that size reads (a ~3 MB
    # one failed, "straddles two block boundaries"), and column types are guessed from more rows
    if fmt == "csv":
        reader = pa_csv.open_csv(
            source, read_options=pa_csv.ReadOptions(block_size=_BLOCK,
                                                    encoding=encoding or "utf8"),
            convert_options=pa_csv.ConvertOptions(column_types=types))
    elif encoding is not None and encoding.lower().replace("-", "") != "utf8":
        raise CommandFailure("JSON Lines are UTF-8 (RFC 8259): --encoding is for CSV", code=2)
    elif hasattr(pa_json, "open_json"):
        parse = pa_json.ParseOptions(explicit_schema=pa.schema(types.items()),
                                     unexpected_field_behavior="infer")
        reader = pa_json.open_json(source, read_options=pa_json.ReadOptions(block_size=_BLOCK),
                                   parse_options=parse)
    else:  # pyarrow < 19 has no streaming JSON reader: the file is read whole
        reader = pa_json.read_json(source, parse_options=pa_json.ParseOptions(
            explicit_schema=pa.schema(types.items()), unexpected_field_behavior="infer")
        ).to_reader()
    unknown = sorted(set(types) - set(reader.schema.names))
    if unknown:
        raise CommandFailure(f"--column-type names {unknown}, not columns of {source}; it "
                             f"has {reader.schema.names}", code=2)
    batches = iter(reader)
    first = next(batches, None)
    if first is None:  # a header alone: an empty dataset of its columns, typed null
        return reader.schema, iter(()), [source]
    check_guessed(reader.schema, types, source)
    return reader.schema, itertools.chain([first], batches), [source]


def check_guessed(schema: pa.Schema, typed: dict[str, pa.DataType], source: str) -> None:
    """Refuse the guesses that would write something other than the text: a null type (the
    column was empty in every row guessed from) and binary (text that is not UTF-8)."""
    for field in schema:
        if field.name in typed:
            continue
        if pa.types.is_null(field.type):
            raise CommandFailure(
                f"{source}: column {field.name!r} is empty in every row its type was guessed "
                f"from; pass --column-type {field.name}=TYPE (float64, string...)")
        if pa.types.is_binary(field.type):
            raise CommandFailure(
                f"{source}: column {field.name!r} holds text that is not UTF-8; pass "
                "--encoding with the file's encoding (latin-1, cp1252...), or --column-type "
                f"{field.name}=binary to keep its raw bytes")


_EXACT = 2**53  # from here on, float64 holds only some of the integers


def check_exact(batch: pa.RecordBatch, typed: dict[str, pa.DataType], first_row: int,
                source: str) -> None:
    """Refuse integers that a guessed float64 column rounded: past 2**53, as 64-bit ids and
    hashes are (a CSV id column of 18446744073709551615 became 1.8446744073709552e+19)."""
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        if name in typed or not pa.types.is_float64(column.type):
            continue
        values = column.to_numpy(zero_copy_only=False)
        with np.errstate(invalid="ignore"):
            rounded = np.isfinite(values) & (np.abs(values) >= _EXACT) & (
                values == np.floor(values))
        if rounded.any():
            row = first_row + int(np.argmax(rounded)) + 1
            raise CommandFailure(
                f"{source}: column {name!r} was guessed float64, and its row {row:,} (from 1, "
                f"after any header) holds an integer past 2**53 that float64 cannot hold "
                f"exactly (read as {float(values[rounded][0])!r}); pass --column-type "
                f"{name}=int64 (or uint64, or string), or --column-type {name}=float64 if "
                "rounding it is fine")


def counted(batches: Iterator[pa.RecordBatch], source: str, fmt: str, rows: list[int],
            typed: dict[str, pa.DataType] | None = None) -> Iterator[pa.RecordBatch]:
    """Pass batches through, counting rows; a read error names the file it came from, and so
    do rounded integers (:func:`check_exact`)."""
    try:
        for batch in batches:
            for column in batch.columns:  # invalid UTF-8 in a string column, caught here:
                if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                    column.validate(full=True)  # written, it fails every read after
            if fmt != "parquet":
                check_exact(batch, typed or {}, rows[0], source)
            rows[0] += batch.num_rows
            yield batch
    except (pa.ArrowException, OSError) as exc:
        raise CommandFailure(f"{source}: {exc}; {HINTS[fmt]}") from exc


