"""The command line: `pqloader inspect` a dataset, `pqloader write` one from CSV, JSON, Parquet."""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

import pqloader

FORMATS = ("csv", "jsonl", "parquet")
CODECS = ("none", "snappy", "gzip", "brotli", "lz4", "zstd")
_EXTENSIONS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
               ".parquet": "parquet", ".pq": "parquet"}
_COMPRESSED = (".gz", ".bz2", ".zst", ".lz4")  # pyarrow decompresses these by extension
_HINTS = {"csv": "column types are inferred from the first block of rows; fix the value named",
          "jsonl": "expected JSON Lines: one object per line, the same keys and types in each"}
_MAX_FILES_SHOWN = 20
_WRITE_DEFAULTS = {name: p.default
                   for name, p in inspect.signature(pqloader.write_dataset).parameters.items()}


class _Failure(Exception):
    """A failure to report as ``pqloader: <message>``; ``code`` 2 means bad usage."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# -- inspect ---------------------------------------------------------------------------------
def human_bytes(size: int) -> str:
    """``1288490189`` -> ``'1.2 GiB'``: binary units, one decimal."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _file_facts(path: str, md: pq.FileMetaData, columns: set[str] | None) -> dict[str, Any]:
    """Rows, row groups, bytes and codecs of one footer, counting only ``columns`` if given."""
    compressed = uncompressed = 0
    codecs: set[str] = set()
    for i in range(md.num_row_groups):
        group = md.row_group(i)
        for j in range(group.num_columns):
            chunk = group.column(j)
            top = chunk.path_in_schema  # "tokens.list.element" belongs to column "tokens"
            if columns is not None and not any(top == c or top.startswith(c + ".")
                                               for c in columns):
                continue
            compressed += chunk.total_compressed_size
            uncompressed += chunk.total_uncompressed_size
            codecs.add(chunk.compression)
    return {"path": path, "num_rows": md.num_rows, "num_row_groups": md.num_row_groups,
            "compressed_bytes": compressed, "uncompressed_bytes": uncompressed,
            "compression": sorted(codecs)}


def inspect_dataset(source: str, columns: list[str] | None = None) -> dict[str, Any]:
    """The facts ``pqloader inspect`` prints, as one JSON-serialisable dict."""
    ds = pqloader.ParquetDataset(source, columns=columns)
    wanted = None if columns is None else set(columns)
    files = [_file_facts(p, md, wanted) for p, md in zip(ds.files, ds.metadata, strict=True)]
    codecs = sorted({c for f in files for c in f.pop("compression")})
    return {
        "path": source,
        "num_files": len(files),
        "num_rows": sum(f["num_rows"] for f in files),
        "num_row_groups": sum(f["num_row_groups"] for f in files),
        "compressed_bytes": sum(f["compressed_bytes"] for f in files),
        "uncompressed_bytes": sum(f["uncompressed_bytes"] for f in files),
        "compression": codecs,
        "schema": [{"name": n, "type": str(t)} for n, t in ds.columns.items()],
        "files": files,
    }


def _print_inspect(facts: dict[str, Any]) -> None:
    print(f"path          {facts['path']}")
    print(f"files         {facts['num_files']:,}")
    print(f"rows          {facts['num_rows']:,}")
    print(f"row groups    {facts['num_row_groups']:,}")
    print(f"compressed    {human_bytes(facts['compressed_bytes'])}")
    print(f"uncompressed  {human_bytes(facts['uncompressed_bytes'])}")
    print(f"compression   {', '.join(facts['compression']) or '-'}")
    print("schema")
    for field in facts["schema"]:
        print(f"  {field['name']}: {field['type']}")
    shown = facts["files"][:_MAX_FILES_SHOWN]
    width = max([len("path"), *(len(f["path"]) for f in shown)])
    print(f"{'path':<{width}}  {'rows':>12}  {'row groups':>10}  {'compressed':>10}")
    for f in shown:
        print(f"{f['path']:<{width}}  {f['num_rows']:>12,}  {f['num_row_groups']:>10,}  "
              f"{human_bytes(f['compressed_bytes']):>10}")
    if len(facts["files"]) > len(shown):
        print(f"... {len(facts['files']) - len(shown):,} more")


def _cmd_inspect(args: argparse.Namespace) -> int:
    columns = None
    if args.columns is not None:
        columns = [c.strip() for c in args.columns.split(",") if c.strip()]
        if not columns:
            raise _Failure(f"--columns {args.columns!r} names no column; give a,b,...", code=2)
    facts = inspect_dataset(args.path, columns)
    if args.json:
        print(json.dumps(facts))
    else:
        _print_inspect(facts)
    return 0


# -- write -----------------------------------------------------------------------------------
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
        raise _Failure(f"{source}: cannot tell the format from the name; pass "
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
                raise _Failure(f"{path}: {exc}; the file may be truncated or corrupt") from exc

    return schema, gen(), ds.files


def _open(source: str, fmt: str) -> tuple[pa.Schema, Iterator[pa.RecordBatch], list[str]]:
    if fmt == "parquet":
        return _parquet_batches(source)
    if not Path(source).is_file():
        raise _Failure(f"{source}: no such file; check the path")
    reader = pa_csv.open_csv(source) if fmt == "csv" else pa_json.open_json(source)
    return reader.schema, iter(reader), [source]


def _counted(batches: Iterator[pa.RecordBatch], source: str, fmt: str,
             rows: list[int]) -> Iterator[pa.RecordBatch]:
    """Pass batches through, counting rows; a read error names the file it came from."""
    try:
        for batch in batches:
            rows[0] += batch.num_rows
            yield batch
    except (pa.ArrowException, OSError) as exc:
        hint = f"; {_HINTS[fmt]}" if fmt in _HINTS else ""
        raise _Failure(f"{source}: {exc}{hint}") from exc


def _cmd_write(args: argparse.Namespace) -> int:
    fmt = args.format or guess_format(args.src)
    try:
        schema, batches, inputs = _open(args.src, fmt)
    except (pa.ArrowException, OSError) as exc:
        if isinstance(exc, pqloader.PQLoaderError):
            raise
        raise _Failure(f"{args.src}: {exc}; if it is not {fmt}, pass --format") from exc
    dst = Path(args.dst).resolve()
    if any(Path(p).resolve().is_relative_to(dst) for p in inputs):
        raise _Failure(f"{args.dst}: holds the input {args.src}; write to another directory",
                       code=2)
    rows = [0]
    stream = pa.RecordBatchReader.from_batches(schema, _counted(batches, args.src, fmt, rows))
    paths = pqloader.write_dataset(
        stream, args.dst, rows_per_file=args.rows_per_file, row_group_size=args.row_group_size,
        compression=args.compression, overwrite=args.overwrite, progress=not args.no_progress)
    if args.json:
        print(json.dumps({"path": args.dst, "num_files": len(paths), "num_rows": rows[0],
                          "files": paths}))
    else:
        print(f"wrote {len(paths):,} files, {rows[0]:,} rows to {args.dst}")
    return 0


# -- the parser and main ---------------------------------------------------------------------
def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``pqloader`` argument parser with its subcommands."""
    parser = argparse.ArgumentParser(prog="pqloader", description=__doc__)
    parser.add_argument("--version", action="version", version=f"pqloader {pqloader.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ins = commands.add_parser("inspect", help="files, rows, row groups, bytes and schema")
    ins.add_argument("path", help="a directory, a glob or a Parquet file")
    ins.add_argument("--columns", metavar="A,B", help="only these columns (schema and bytes)")
    ins.add_argument("--json", action="store_true", help="print one JSON object")
    ins.set_defaults(run=_cmd_inspect, parser=ins)

    wr = commands.add_parser("write", help="CSV, JSON lines or Parquet in; sharded Parquet out")
    wr.add_argument("src", help="a .csv, .jsonl/.ndjson/.json or .parquet file, or a directory")
    wr.add_argument("dst", help="the directory to write part-NNNNN.parquet files into")
    wr.add_argument("--format", choices=FORMATS, help="the format of SRC (default: its extension)")
    wr.add_argument("--rows-per-file", type=_positive_int, metavar="N",
                    default=_WRITE_DEFAULTS["rows_per_file"], help="default: %(default)s")
    wr.add_argument("--row-group-size", type=_positive_int, metavar="N",
                    default=_WRITE_DEFAULTS["row_group_size"], help="default: %(default)s")
    wr.add_argument("--compression", choices=CODECS, type=str.lower,
                    default=_WRITE_DEFAULTS["compression"], help="default: %(default)s")
    wr.add_argument("--overwrite", action="store_true", help="replace part-*.parquet in DST")
    wr.add_argument("--no-progress", action="store_true", help="no progress bar")
    wr.add_argument("--json", action="store_true", help="print the summary as JSON")
    wr.set_defaults(run=_cmd_write, parser=wr)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``pqloader`` with ``argv`` (default ``sys.argv[1:]``); return the exit code.

    0: done; 1: the command failed (message on stderr); 2: bad usage.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version and usage errors; return, do not exit
        return 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 2
    try:
        code: int = args.run(args)
        return code
    except _Failure as exc:
        if exc.code == 2:
            args.parser.print_usage(sys.stderr)
            print(f"{args.parser.prog}: error: {exc}", file=sys.stderr)
        else:
            print(f"pqloader: {exc}", file=sys.stderr)
        return exc.code
    except (pqloader.PQLoaderError, OSError, pa.ArrowException) as exc:
        print(f"pqloader: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("pqloader: interrupted", file=sys.stderr)
        return 130
