"""The sources ``pqloader write`` reads: CSV, JSON Lines or a Parquet dataset, as Arrow batches."""

from __future__ import annotations

import codecs
import itertools
import json
import os
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json

import pqloader

from ._errors import unreadable
from ._guesses import guess_problem, rounding_problem
from ._texts import TextProblem, Zones, alongside, padded

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
    if not path.exists():
        raise CommandFailure(f"{source}: no such file or folder; check the path")
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


def _parquet_batches(source: str, columns: list[str] | None = None
                     ) -> tuple[pa.Schema, Iterator[pa.RecordBatch], list[str]]:
    """The dataset's rows in order, a row group at a time, as pqloader reads them: its hive
    partition columns (only ``key=value`` folders: a plain folder named like a column replaced
    its values with ""), types unified across files, INT96 in microseconds; ``columns``
    alone, where given (files whose columns differ: those they share)."""
    ds = pqloader.ParquetDataset(source, columns=columns)  # checks every footer and the
    # schema before writing

    def gen() -> Iterator[pa.RecordBatch]:
        try:
            for fragment in range(ds.num_row_groups):
                table = ds.reader.read(fragment).replace_schema_metadata(ds.schema.metadata)
                yield from table.to_batches()
        except pqloader.PQLoaderError as exc:  # it says what to do already
            raise CommandFailure(str(exc)) from exc
        except (pa.ArrowException, OSError) as exc:
            raise CommandFailure(f"{exc}; {HINTS['parquet']}") from exc

    return ds.schema, gen(), ds.files


_BLOCK = 16 << 20
_OTHER_DELIMITERS = (";", "\t", "|")  # a one-column header holding one: refused, unless asked


def open_source(source: str, fmt: str, column_types: dict[str, pa.DataType] | None = None,
                encoding: str | None = None, delimiter: str | None = None,
                columns: list[str] | None = None
                ) -> tuple[pa.Schema, Iterator[pa.RecordBatch], list[str]]:
    """The source's schema, its batches and the files they come from.

    CSV and JSON Lines have no types: pyarrow guesses them from the first block, and
    ``column_types`` sets those the guess gets wrong (``_guesses.py`` names them). A CSV
    file's fields are separated by ``delimiter`` (default: a comma).
    """
    types = dict(column_types or {})
    if fmt == "parquet" and (types or encoding):
        raise CommandFailure("--column-type and --encoding are for CSV and JSON Lines; a "
                             "Parquet source has its types and encoding", code=2)
    if fmt != "csv" and delimiter is not None:
        raise CommandFailure(f"--delimiter is for CSV; a {fmt} source has no delimiter",
                             code=2)
    if fmt != "parquet" and columns is not None:
        raise CommandFailure(f"--columns is for a Parquet source; a {fmt} source is written "
                             "whole", code=2)
    if fmt == "parquet":
        return _parquet_batches(source, columns)
    if not Path(source).is_file():
        raise CommandFailure(f"{source}: no such file (a {fmt} source is one file); "
                             "check the path")
    text_encoding(encoding, fmt)
    try:
        open(source, "rb").close()  # unreadable: said so, not as a value that fits no guess
    except OSError as exc:
        raise CommandFailure(str(unreadable(source, exc) or f"{source}: {exc}")) from exc
    try:
        reader = _open_csv(source, types, encoding, delimiter) if fmt == "csv" else \
            _open_json(source, types)
        batches = iter(reader)
        first = next(batches, None)
        schema = reader.schema
        # JSON Lines: a key first seen past the first block has no guess to set (found in
        # review: its own error pointed to --column-type, which refused it); a file in one
        # block was guessed whole
        unknown = sorted(set(types) - set(schema.names)) \
            if fmt == "csv" or _one_block(source) else []
    except UnicodeError as exc:  # in the header, or the first block
        raise CommandFailure(f"{source}: not {encoding or 'utf8'} text ({exc}); pass the "
                             "file's --encoding (latin-1, cp1252, utf-16...)") from exc
    if unknown:
        raise CommandFailure(f"--column-type names {unknown}, not columns of {source}; it "
                             f"has {schema.names}", code=2)
    if not len(schema):  # JSON Lines of {}: rows of no column
        raise CommandFailure(f"{source} holds no column: nothing to write")
    if fmt == "csv" and delimiter is None and len(schema) == 1 and \
            (sign := next((c for c in _OTHER_DELIMITERS if c in schema.names[0]), None)):
        # a file of ';' (Excel in many locales), tabs or '|' read as one column: its rows
        # would be written whole as text, and a quoted newline split one row in two
        shown = {"\t": "tab"}.get(sign, sign)
        raise CommandFailure(f"{source}: its header {schema.names[0]!r} reads as one column "
                             f"holding {shown!r}: if its fields are separated so, pass "
                             f"--delimiter {shown!r}", code=2)
    if twice := sorted({n for n in schema.names if schema.names.count(n) > 1}):
        raise CommandFailure(f"{source}: its header names {twice} twice; rename them (a "
                             "dataset's columns are read by name)")
    if first is None:  # a header alone: an empty dataset of its columns, typed null
        return schema, iter(()), [source]
    if problem := guess_problem(schema, types, source):
        raise CommandFailure(problem)
    rows: Iterator[pa.RecordBatch] = itertools.chain([first], batches)
    if fmt == "csv":
        rows = _closed(_unpadded(rows, source, schema, types, encoding, delimiter), source,
                       encoding)
    else:
        schema, rows = _zoned(rows, source, schema, types)
    return schema, rows, [source]


def _closed(batches: Iterator[pa.RecordBatch], source: str, encoding: str | None
            ) -> Iterator[pa.RecordBatch]:
    """``batches``, refused at their end when the last value runs from a quote never closed
    to the end of the file: pyarrow reads it so (values may hold newlines), and the rows
    after it were written inside it, silently (found in review). An unclosed quote in
    another column leaves its row short of fields, which pyarrow refuses itself."""
    last = None
    for batch in batches:
        last = batch if batch.num_rows else last
        yield batch
    if last is None or not last.num_columns:
        return
    value = last.column(last.num_columns - 1)[last.num_rows - 1].as_py()
    if not (isinstance(value, str) and ("\n" in value or "\r" in value)):
        return
    with open(source, "rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - 64))
        tail = f.read().decode(encoding or "utf8", errors="ignore").rstrip("\r\n\x00 \t")
    if not tail.endswith('"'):
        name = last.schema.names[-1]
        raise CommandFailure(
            f"{source}: the last row's {name!r} runs from a quote to the end of the file, "
            f"across {value.count(chr(10)):,} line(s): a quote opened there is never closed, "
            "and the rows after it would be written inside it. Close it (a quote inside a "
            'quoted value is written "")')


def text_encoding(encoding: str | None, fmt: str) -> None:
    """Refuse an ``--encoding`` that is not a text encoding, or not UTF-8 for JSON Lines."""
    if encoding is None:
        return
    try:
        info = codecs.lookup(encoding)
    except LookupError:
        raise CommandFailure(f"--encoding {encoding}: no such text encoding; try utf8, "
                             "latin-1 or cp1252", code=2) from None
    if not getattr(info, "_is_text_encoding", True):  # base64, rot13: bytes to bytes
        raise CommandFailure(f"--encoding {encoding} is not a text encoding; try utf8, "
                             "latin-1 or cp1252", code=2)
    if fmt == "jsonl" and info.name != "utf-8":
        raise CommandFailure("JSON Lines are UTF-8 (RFC 8259): --encoding is for CSV", code=2)


# Blocks of 16 MiB, not pyarrow's 1 MiB: a field or a line up to that size reads (a ~3 MB one
# failed, "straddles two block boundaries"), and column types are guessed from more rows.
def _open_csv(source: str, types: dict[str, pa.DataType], encoding: str | None,
              delimiter: str | None, only: list[str] | None = None) -> Any:
    return pa_csv.open_csv(
        source, read_options=pa_csv.ReadOptions(block_size=_BLOCK, encoding=encoding or "utf8"),
        # quoted fields may hold newlines (RFC 4180): without this, one past the first block
        # failed, "out of sync with chunker" (measured: no slower on 2M rows)
        parse_options=pa_csv.ParseOptions(delimiter=delimiter or ",", newlines_in_values=True),
        convert_options=pa_csv.ConvertOptions(column_types=types, include_columns=only))


def _unpadded(batches: Iterator[pa.RecordBatch], source: str, schema: pa.Schema,
              types: dict[str, pa.DataType], encoding: str | None,
              delimiter: str | None) -> Iterator[pa.RecordBatch]:
    """``batches``, refused at the first text with leading zeros or a hexadecimal number in a
    column guessed integer (zip codes, phone numbers, padded ids: "01234" became 1234), or
    leading zeros or a number past float64's range in one guessed float: those columns read
    again as text, alongside (``_texts.py``)."""
    guessed = [f.name for f in schema if (pa.types.is_integer(f.type) or pa.types.is_floating(
        f.type)) and f.name not in types]
    if not guessed:
        return batches
    text = iter(_open_csv(source, dict.fromkeys(guessed, pa.string()), encoding, delimiter,
                          guessed))
    return alongside(batches, text, _failing(
        lambda block, first: padded(block, first, source, schema, guessed)))


def _zoned(batches: Iterator[pa.RecordBatch], source: str, schema: pa.Schema,
           types: dict[str, pa.DataType]) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """JSON Lines: ``batches`` and their schema, each column guessed timestamp in UTC if its
    times name a zone offset (pyarrow dropped the zone), refused where some do and some do
    not (``_texts.Zones``)."""
    naive = [f.name for f in schema if pa.types.is_timestamp(f.type) and f.type.tz is None]
    if not naive:
        return schema, batches
    guessed = [n for n in naive if n not in types]  # (typed so: still no two clocks, found
    zones = Zones(source, naive)  # in review, but the type asked for is kept)
    text = iter(_open_json(source, {**types, **dict.fromkeys(naive, pa.string())}))
    checked = alongside(batches, text, _failing(zones.check))  # (the first block: now)
    utc = zones.schema(schema, guessed)

    def gen() -> Iterator[pa.RecordBatch]:
        for batch in checked:
            if late := [n for n in guessed if zones.zoned.get(n) and
                        utc.field(n).type.tz is None]:
                raise CommandFailure(
                    f"{source}: column {late[0]!r} was guessed a timestamp without a zone, "
                    "and its first time, past the first block, names a zone offset; pass "
                    f"--column-type {late[0]}=string to keep the text")
            yield batch if utc is schema else pa.RecordBatch.from_arrays(  # (the reader's
                [c.cast(f.type) for c, f in zip(batch.columns, utc, strict=True)],  # names)
                schema=utc)

    return utc, gen()


def _failing(check: Callable[[pa.RecordBatch, int], None]
             ) -> Callable[[pa.RecordBatch, int], None]:
    def run(block: pa.RecordBatch, first_row: int) -> None:
        try:
            check(block, first_row)
        except TextProblem as exc:
            raise CommandFailure(str(exc)) from None
    return run


def _open_json(source: str, types: dict[str, pa.DataType]) -> Any:
    """A JSON Lines reader; ``types`` set in the guessed schema, whose order is the file's (an
    explicit schema alone puts its columns first, and adds a misspelled one, all nulls)."""
    read = pa_json.ReadOptions(block_size=_BLOCK)

    def open_(parse: pa_json.ParseOptions | None = None) -> Any:
        if hasattr(pa_json, "open_json"):
            return pa_json.open_json(source, read_options=read, parse_options=parse)
        # pyarrow < 19 has no streaming JSON reader: the file is read whole
        return pa_json.read_json(source, read_options=read, parse_options=parse).to_reader()

    guessed = open_().schema
    if not types:
        return open_()
    # keys not in the first block (a sparse key, first seen later) come after the guessed;
    # in a file of one block, open_source refuses them (a misspelled key)
    late = [pa.field(n, t) for n, t in types.items() if n not in guessed.names] \
        if not _one_block(source) else []
    schema = pa.schema([pa.field(f.name, types.get(f.name, f.type)) for f in guessed] + late)
    return open_(pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer"))


def counted(batches: Iterator[pa.RecordBatch], source: str, fmt: str, rows: list[int],
            typed: dict[str, pa.DataType] | None = None) -> Iterator[pa.RecordBatch]:
    """Pass batches through, counting rows; a read error names the file it came from, and so
    do rounded integers (``_guesses.rounding_problem``)."""
    typed = typed or {}
    names: list[str] = []
    types: dict[str, pa.DataType] = dict(typed)  # each column's, as the batches have them
    unseen = set(typed) if fmt == "jsonl" else set()  # a --column-type key no row has yet
    try:
        for batch in batches:
            names = batch.schema.names
            types = {f.name: f.type for f in batch.schema}
            unseen -= {n for n in unseen if batch.column(n).null_count < batch.num_rows}
            for column in batch.columns:  # invalid UTF-8 in a string column, caught here:
                if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                    column.validate(full=True)  # written, it fails every read after
            problem = None if fmt == "parquet" else rounding_problem(
                batch, typed, rows[0], source, fmt)
            if problem:
                raise CommandFailure(problem)
            rows[0] += batch.num_rows
            yield batch
        if unseen:  # a key misspelled, taken as one first seen late: a column of nulls
            warnings.warn(f"--column-type {', '.join(sorted(unseen))}: no row of {source} has a "
                          "value for it; written as a column of nulls (a misspelled key?)",
                          UserWarning, stacklevel=2)
    except (pa.ArrowException, OSError) as exc:
        if fmt == "jsonl" and "unexpected field" in str(exc) and names and \
                (late := late_key(source, rows[0], names)):
            row, key = late
            raise CommandFailure(
                f"{source}: row {row:,} (from 1) has the key {key!r}, which no row of the first "
                f"{_BLOCK >> 20} MiB has: its type was not guessed. Pass --column-type "
                f"{key}=TYPE (string, int64, float64...) to write it") from exc
        said = file_rows(str(exc), rows[0]) if fmt == "jsonl" else str(exc)
        if fmt == "jsonl" and (unfit := unfit_failure(source, rows[0], said, typed, types)):
            raise unfit from exc
        if fmt == "csv" and (m := re.search(r"In CSV column #(\d+)", said)) and \
                int(m[1]) < len(names):  # a later value that does not fit the guess
            name = names[int(m[1])]
            raise CommandFailure(
                f"{source}: {said.replace(m[0], f'{m[0]} ({name!r})')}; its type was guessed "
                f"from the first {_BLOCK >> 20} MiB: pass --column-type {name}=TYPE (float64, "
                "string...) to fit every value") from exc
        raise CommandFailure(f"{source}: {said}; {hint(fmt, typed, said)}") from exc
    except UnicodeError as exc:  # past the first block, in a CSV read with --encoding
        raise CommandFailure(f"{source}: text that its encoding cannot decode after row "
                             f"{rows[0]:,} ({exc}); pass the file's --encoding") from exc


def _one_block(source: str) -> bool:
    """Whether pyarrow guesses the types from the whole file (its first block is all of it)."""
    return Path(source).stat().st_size <= _BLOCK


def late_key(source: str, after: int, names: list[str]) -> tuple[int, str] | None:
    """The first row past the first ``after`` rows of a JSON Lines ``source`` with a key not
    in ``names``, and that key (read again line by line: only for the error's message)."""
    known = set(names)
    for row, record in _records_after(source, after):
        extra = [k for k in record if k not in known]
        if extra:
            return row, extra[0]
    return None


def _records_after(source: str, after: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """The objects of a JSON Lines ``source`` past its first ``after`` rows, each with its row
    (from 1), read again line by line for an error's message; up to a line that is no JSON."""
    row = 0
    with open(source, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            row += 1
            if row <= after:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                return
            if isinstance(record, dict):
                yield row, record


def unfit_failure(source: str, after: int, said: str, typed: dict[str, pa.DataType],
                  types: dict[str, pa.DataType] | None = None) -> CommandFailure | None:
    """pyarrow's JSON error ``said`` of a value it could not convert, with the value's row
    and key (its message names neither: found by a fuzzer), found past the first ``after``
    rows of ``source`` read again line by line (for the error's message only): a value of
    that text under a key of the type named (``types``, else ``typed``: each column's, as
    known), or of any key where none is known of that type."""
    m = re.search(r"Failed to convert JSON to (.+?), couldn't parse:(.*)", said)
    if m is None or not os.path.isfile(source):
        return None
    keys = {k for k, t in (types or typed).items() if str(t) == m[1]} or None
    for row, record in _records_after(source, after):
        for key, value in record.items():
            if (keys is not None and key not in keys) or \
                    (value if isinstance(value, str) else json.dumps(value)) != m[2]:
                continue
            why = f"--column-type {key}={typed[key]} does not fit it" if key in typed \
                else f"its type was guessed from the first {_BLOCK >> 20} MiB"
            return CommandFailure(f"{source}: row {row:,} (from 1), key {key!r}: {said}; "
                                  f"{why}: pass --column-type {key}=TYPE that fits every "
                                  "value (float64, string...)")
    return None


def file_rows(message: str, before: int) -> str:
    """pyarrow's JSON error ``message`` with its row counted in the file, from 1: pyarrow
    counts from 0 in its block, which starts ``before`` rows into the file."""
    return re.sub(r"\bin row (\d+)",
                  lambda m: f"in row {before + int(m[1]) + 1:,} of the file (from 1)", message)


def hint(fmt: str, typed: dict[str, pa.DataType], said: str = "") -> str:
    """What to do about a read error of this format (``said``: pyarrow's message)."""
    if fmt == "csv" and (m := re.search(r"Expected (\d+) columns, got \d+", said)):
        return (f"every row needs the header's {m[1]} fields (a field holding the delimiter "
                "or a newline must be quoted; --delimiter sets another one)")
    given = "; or a --column-type given does not fit the values" if typed else ""
    return HINTS[fmt] + given


