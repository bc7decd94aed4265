"""The command line: `pqloader inspect|write|bench|tune|audit|cache`, one function each."""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

import pqloader

from ._cache_cli import cmd_cache
from ._convert import (
    CODECS,
    FORMATS,
    CommandFailure,
    counted,
    file_rows,
    guess_format,
    hint,
    open_source,
    unfit_failure,
)
from ._guesses import column_type
from ._inspect import inspect_dataset, print_inspect

if TYPE_CHECKING:
    from ._bench import BenchResult

_BATCH_HELP = "rows per batch (default: 4,096, or fewer to keep a batch under 64 MiB decoded)"
_WRITE_DEFAULTS = {name: p.default  # one source of truth: write_dataset's own defaults
                   for name, p in inspect.signature(pqloader.write_dataset).parameters.items()
                   if name in ("rows_per_file", "row_group_size", "compression")}


# -- inspect ---------------------------------------------------------------------------------
def _cmd_inspect(args: argparse.Namespace) -> int:
    facts = inspect_dataset(args.path, args.columns, args.skip_bad_files)
    if args.json:
        print(json.dumps(facts))
    else:
        print_inspect(facts)
    return 1 if facts.get("skipped") else 0


# -- write -----------------------------------------------------------------------------------
def _cmd_write(args: argparse.Namespace) -> int:
    source, target = args.src.removeprefix("file://"), args.dst.removeprefix("file://")
    if "://" in source:
        raise CommandFailure(f"SRC {source}: pqloader write reads local files; copy them here "
                             "first (a remote dataset opens for training as it is: "
                             "pqloader.ParquetDataset(url))", code=2)
    if "://" in target:
        raise CommandFailure(f"DST {target}: pqloader write writes a local folder; write "
                             "there, then copy the folder to the store", code=2)
    fmt = args.format or guess_format(source)
    try:
        typed = dict(args.column_type or [])
        schema, batches, inputs = open_source(source, fmt, typed, args.encoding,
                                              args.delimiter, args.columns)
    except (pa.ArrowException, OSError) as exc:
        if isinstance(exc, pqloader.PQLoaderError):
            raise
        said = file_rows(str(exc), 0) if fmt == "jsonl" else str(exc)  # in the first block
        if fmt == "jsonl" and (unfit := unfit_failure(source, 0, said, typed)):
            raise unfit from exc
        raise CommandFailure(f"{source}: {said}; {hint(fmt, typed, said)}, or pass --format "
                             f"if it is not {fmt}") from exc
    dst, src = Path(target).resolve(), Path(source).resolve()
    if (src.is_dir() and dst.is_relative_to(src)) or any(
            Path(p).resolve().is_relative_to(dst) for p in inputs):
        raise CommandFailure(f"{target} and {source} overlap; write outside the input, or "
                       "reading either later would see the other", code=2)
    rows = [0]
    stream = pa.RecordBatchReader.from_batches(schema, counted(batches, source, fmt, rows,
                                                               typed))
    # --overwrite over a dataset writes the new files aside and swaps them in only at the end
    replacing = args.overwrite and any(Path(target).glob("part-*.parquet"))
    try:
        paths = pqloader.write_dataset(
            stream, target, rows_per_file=args.rows_per_file,
            row_group_size=args.row_group_size, compression=args.compression,
            overwrite=args.overwrite, progress=False if args.no_progress else None)
    except pqloader.InvalidArgumentError as exc:  # its advice is for Python callers
        raise CommandFailure(_in_cli_words(str(exc), args)) from exc
    except CommandFailure as exc:  # say what the error left in DST
        done = len(list(Path(target).glob("part-*.parquet")))
        if replacing:  # those files are the old dataset, not a partial new one
            raise CommandFailure(f"{exc}; {target} was left unchanged: it still holds the "
                                 f"previous dataset ({done} file{'s' * (done != 1)})") from exc
        raise CommandFailure(f"{exc}; {target} keeps {done} file{'s' * (done != 1)} written "
                             "before the error: "
                       "delete them or rerun with --overwrite" if done else str(exc)) from exc
    files, count = len(paths), rows[0]
    print(f"wrote {files:,} file{'s' * (files != 1)}, {count:,} row{'s' * (count != 1)} to "
          f"{target}")
    return 0


# -- the parser and main ---------------------------------------------------------------------
def _delimiter(text: str) -> str:
    sign = {"tab": "\t", "\\t": "\t"}.get(text.lower(), text)
    if len(sign) != 1 or sign in "\r\n\"":
        raise argparse.ArgumentTypeError(f"{text!r} is not one character (a comma, ';', '|', "
                                         "or tab)")
    return sign


def _names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected column names like a,b, got {text!r}")
    return names


BATCH_ROWS = 4096  # bench's and tune's batches by default: this many rows at most,
BATCH_BYTES = 64 * 2**20  # and at most this many bytes decoded


def default_batch_size(ds: pqloader.ParquetDataset) -> int:
    """``--batch-size`` when not given: 4,096 rows, or fewer where they decode to more than
    64 MiB (a shuffle window is lifted to the batch: 4,096 images of 786 KB made bench hold
    4.5 GiB for its first batch, 9 s late, found in review)."""
    from ._config import bytes_per_row  # with torch: commands that do not load skip it

    d = ds._discovery
    per_row = bytes_per_row(d.num_rows, d.byte_size)
    return max(1, min(BATCH_ROWS, int(BATCH_BYTES // per_row)))


def _cmd_bench(args: argparse.Namespace) -> int:
    from ._bench import bench

    if args.num_workers == "auto" and args.worker_type == "process":  # a usage error: 2
        raise CommandFailure("--num-workers auto tunes thread workers: drop --worker-type "
                             "process, or give a number of processes", code=2)
    ds = pqloader.ParquetDataset(args.path, columns=args.columns)
    args.batch_size = args.batch_size or default_batch_size(ds)
    result = bench(ds, max_batches=args.max_batches,
                   progress=False if args.no_progress else None,
                   batch_size=args.batch_size, shuffle=not args.no_shuffle, seed=args.seed,
                   num_workers=args.num_workers, worker_type=args.worker_type,
                   device=args.device, **({} if args.prefetch_factor is None else
                                          {"prefetch_factor": args.prefetch_factor}))
    if args.json:  # with the settings the text shows (they were left out: found in review)
        print(json.dumps({**result.as_dict(), "batch_size": args.batch_size,
                          "num_workers": args.num_workers, "worker_type": args.worker_type,
                          "prefetch_factor": args.prefetch_factor,
                          "shuffle": not args.no_shuffle, "device": args.device}))
    else:
        epochs = f" over {result.epochs} epochs" if result.epochs > 1 else ""
        print(f"{result.rows:,} rows in {result.batches:,} batches of {args.batch_size:,}"
              f"{epochs} in {result.seconds:.2f} s: {result.rows_per_s:,.0f} rows/s; "
              + ("no batch" if result.first_batch_s is None else
                 f"first batch after {result.first_batch_s:.2f} s") + "; peak RSS "
              f"~{result.peak_rss_mib:,.0f} MiB "
              f"({args.num_workers} {args.worker_type} workers{_auto(result)}, "
              f"{'no shuffle' if args.no_shuffle else 'shuffled'}, shuffle window "
              f"{result.shuffle_window_rows:,} rows"
              f"{f', to {args.device}' if args.device else ''})")
    return 0


def _auto(result: BenchResult) -> str:
    """What num_workers="auto" ran at: a run timed while its tuner still compared counts
    measured several (the tuner's report was not shown: found in review)."""
    if result.auto_threads is None:
        return ""
    if result.auto_settled is None:
        return f" (still comparing thread counts, at {result.auto_threads} at the end)"
    n = result.auto_settled
    return f" (settled on {n} thread{'' if n == 1 else 's'})"


def _cmd_tune(args: argparse.Namespace) -> int:
    from ._bench import tune

    ds = pqloader.ParquetDataset(args.path, columns=args.columns)
    if not len(ds):  # every rate would be 0: nothing to rank, and "x best" divides by it
        raise CommandFailure(f"{args.path}: no rows to measure; tune a dataset that has rows")
    args.batch_size = args.batch_size or default_batch_size(ds)
    ranked = tune(ds, batch_size=args.batch_size, max_batches=args.max_batches,
                  repeats=args.repeats, settle_s=args.settle_s, trial_s=args.trial_s,
                  shuffle=not args.no_shuffle)
    if args.json:  # the batch size and shuffle of every run (the text's "best:" line has them)
        print(json.dumps([{**settings, **result.as_dict(), "batch_size": args.batch_size,
                           "shuffle": not args.no_shuffle} for settings, result in ranked]))
        return 0
    best = ranked[0][1].rows_per_s
    print(f"{'num_workers':>11} {'prefetch':>8} {'rows/s':>12} {'x best':>7} {'first s':>8} "
          f"{'peak MiB':>9}")
    for settings, result in ranked:  # the peak: what a setting costs beside its rate
        print(f"{settings['num_workers']:>11} {settings.get('prefetch_factor', '-'):>8} "
              f"{result.rows_per_s:>12,.0f} {result.rows_per_s / best:>7.2f} "
              f"{result.first_batch_s or 0.0:>8.2f} "  # (tune refuses a dataset of no row)
              f"{result.peak_rss_mib:>9,.0f}")
    for settings, result in ranked:
        if settings["num_workers"] == "auto":
            print(f"auto:{_auto(result)}")
    top = {"batch_size": args.batch_size, "shuffle": not args.no_shuffle, **ranked[0][0]}
    opened = "" if args.columns is None else \
        f"  (ds = ParquetDataset(..., columns={args.columns!r}))"
    print("best: DataLoader(ds, " + ", ".join(f"{k}={v!r}" for k, v in top.items()) + ")"
          + opened)
    return 0


def _cmd_audit(args: argparse.Namespace) -> int:
    reports = pqloader.audit(args.dir)
    if not reports:  # a run stopped before its first batch delivered nothing, exactly once
        raise CommandFailure(f"{args.dir}: no batch was recorded (the run stopped before its "
                             "first batch?): no row was delivered")
    if args.json:
        print(json.dumps([{**vars(r), "exactly_once": r.exactly_once} for r in reports]))
    for r in reports if not args.json else []:
        apart = (f" (and {r.padding:,} again: the padding that evens the ranks)" if r.padding
                 else f", but the {r.dropped:,} that drop_last leaves out" if r.dropped else "")
        verdict = f"every row exactly once{apart}" if r.exactly_once else (
            f"{r.duplicates:,} rows more than once, {r.missing:,} rows never")
        if r.reshaped:  # a transform changed their rows: what it delivered is not on record
            verdict += (f"; {r.reshaped:,} batches left a transform or collate_fn with other "
                        "rows than read: not checked")
        print(f"epoch {r.epoch}: {r.delivered:,} deliveries of {r.num_rows:,} rows: {verdict}")
        ranks = ", ".join(f"rank {k}: {v}" for k, v in sorted(r.batches_per_rank.items()))
        print(f"  batches per rank: {ranks}")
        workers = ", ".join(f"{k}: {v}" for k, v in sorted(
            r.batches_per_worker.items(), key=lambda kv: tuple(map(int, kv[0].split("/")))))
        print(f"  batches per rank/worker: {workers}")
        for example in r.duplicate_examples:
            print(f"  repeated rows {example['rows']} in batch {example['batch']} of rank "
                  f"{example['rank']} ({example['file']})")
    return 0 if all(r.exactly_once for r in reports) else 1


def _positive_int(text: str) -> int:
    if not text.strip().replace("_", "").isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def _whole(text: str) -> int:
    if not text.strip().replace("_", "").isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    """A duration: finite and >= 0 (``inf`` or ``nan`` would let a warm-up run forever)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected seconds, a finite number >= 0, got {text!r}")
    return value


def _workers(text: str) -> int | str:
    if text == "auto":
        return text
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0 or 'auto', got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    """The ``pqloader`` argument parser with its subcommands."""
    parser = argparse.ArgumentParser(prog="pqloader", description=__doc__)
    parser.add_argument("--version", action="version", version=f"pqloader {pqloader.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ins = commands.add_parser("inspect", help="files, rows, row groups, bytes and schema")
    ins.add_argument("path", help="a directory, a glob or a Parquet file")
    ins.add_argument("--columns", type=_names, metavar="A,B",
                     help="only these columns (schema and bytes)")
    ins.add_argument("--json", action="store_true", help="print one JSON object")
    ins.add_argument("--skip-bad-files", action="store_true",
                     help="list every file that cannot be read (exit status 1 if any), not "
                          "stop at the first; the others are inspected")
    ins.set_defaults(run=_cmd_inspect, parser=ins)

    wr = commands.add_parser("write", help="CSV, JSON lines or Parquet in; sharded Parquet out")
    wr.add_argument("src", help="a .csv, .jsonl/.ndjson/.json or .parquet file, or a directory")
    wr.add_argument("dst", help="the directory to write part-NNNNN.parquet files into")
    wr.add_argument("--format", choices=FORMATS, help="the format of SRC (default: its extension)")
    wr.add_argument("--rows-per-file", type=_positive_int, metavar="N",
                    help="rows in each file (default: %(default)s)")
    wr.add_argument("--row-group-size", type=_positive_int, metavar="N",
                    help="rows in each row group, the unit of reading and shuffling "
                         "(default: 65,536, or fewer to keep a row group under 16 MiB decoded)")
    wr.add_argument("--compression", choices=CODECS, type=str.lower, help="(default: %(default)s)")
    wr.add_argument("--column-type", type=column_type, action="append", metavar="NAME=TYPE",
                    help="a CSV or JSON column's type (int64, uint64, string, list<int64>...), "
                         "not guessed; repeat for more columns")
    wr.add_argument("--encoding", help="a CSV file's text encoding (default: utf8)")
    wr.add_argument("--delimiter", type=_delimiter, metavar="C",
                    help="what separates a CSV file's fields: one character, or tab "
                         "(default: a comma)")
    wr.add_argument("--columns", type=_names, metavar="A,B",
                    help="a Parquet source's columns to write (default: all)")
    wr.add_argument("--overwrite", action="store_true", help="replace part-*.parquet in DST")
    wr.add_argument("--no-progress", action="store_true", help="no progress bar")
    wr.set_defaults(run=_cmd_write, parser=wr, **_WRITE_DEFAULTS)

    be = commands.add_parser("bench", help="measure a loader on a dataset: rows/s, first batch")
    be.add_argument("path", help="a directory, a glob or a Parquet file")
    be.add_argument("--columns", type=_names, metavar="A,B", help="only these columns")
    be.add_argument("--batch-size", type=_positive_int, metavar="N", help=_BATCH_HELP)
    be.add_argument("--num-workers", type=_workers, default=2, metavar="N",
                    help="a number, or 'auto' (tuned while it runs: measure a few epochs' "
                    "worth, --max-batches, to see it settled)")
    be.add_argument("--worker-type", choices=("thread", "process"), default="thread")
    be.add_argument("--prefetch-factor", type=_positive_int, metavar="N",
                    help="batches each worker makes ahead, as tune tries them (default: 2)")
    be.add_argument("--device", metavar="DEV",
                    help="deliver batches to this CUDA device (e.g. cuda), as DataLoader(device=)")
    be.add_argument("--no-shuffle", action="store_true", help="read in file order")
    be.add_argument("--seed", type=_whole, default=0)
    be.add_argument("--max-batches", type=_positive_int, metavar="N",
                    help="stop after N batches, going on into later epochs past the first "
                    "(default: one epoch)")
    be.add_argument("--no-progress", action="store_true", help="no progress bar")
    be.add_argument("--json", action="store_true", help="print one JSON object")
    be.set_defaults(run=_cmd_bench, parser=be)

    tu = commands.add_parser("tune", help="try loader settings on a dataset, print the best")
    tu.add_argument("path", help="a directory, a glob or a Parquet file")
    tu.add_argument("--columns", type=_names, metavar="A,B", help="only these columns")
    tu.add_argument("--batch-size", type=_positive_int, metavar="N", help=_BATCH_HELP)
    tu.add_argument("--no-shuffle", action="store_true", help="read in file order")
    tu.add_argument("--max-batches", type=_positive_int, default=200, metavar="N",
                    help="batches per trial at least (default: %(default)s)")
    tu.add_argument("--trial-s", type=_seconds, default=2.0, metavar="S",
                    help="seconds per trial at least, batches going on past --max-batches: "
                    "a short trial times batches cut from windows already read, not the reads "
                    "(default: %(default)s)")
    tu.add_argument("--repeats", type=_positive_int, default=2, metavar="N",
                    help="trials per setting, interleaved; the median counts")
    tu.add_argument("--settle-s", type=_seconds, default=30.0, metavar="S",
                    help="each setting is warmed up untimed first: as many batches as it is "
                    "timed for, or num_workers='auto' until its tuner settles, at most S seconds "
                    "(default: %(default)s)")
    tu.add_argument("--json", action="store_true", help="print one JSON list, best first")
    tu.set_defaults(run=_cmd_tune, parser=tu)

    au = commands.add_parser("audit", help="check audit records: every row exactly once?")
    au.add_argument("dir", help="the audit_dir a DataLoader wrote its records into")
    au.add_argument("--json", action="store_true", help="print one JSON list, an epoch each")
    au.set_defaults(run=_cmd_audit, parser=au)

    ca = commands.add_parser("cache", help="list, size or clear a local cache of remote data")
    ca.add_argument("action", choices=("ls", "du", "clear"),
                    help="ls: cached bytes per remote file; du: total; clear: delete all")
    ca.add_argument("dir", help="the cache directory (pqloader.Cache(dir))")
    ca.add_argument("--json", action="store_true", help="print JSON")
    ca.set_defaults(run=cmd_cache, parser=ca)
    return parser


# The library's advice names Python arguments: said in the command line's words, where the
# command has the option (its attribute in the parsed arguments; None: any command)
_CLI_WORDS = (
    ("leave it out with columns=[...] or convert it yourself with collate_fn=",
     "leave it out with --columns (the columns to keep)", "columns"),
    ("columns=[...]", "--columns A,B", "columns"),
    ("or pass collate_fn=", "or leave it out with --columns", "columns"),
    ("pass device=None to keep batches on the host",
     "leave out --device to keep batches on the host", None),
    ("pass device=None and move them yourself", "leave out --device", None),
    ("pass credentials in storage_options (e.g. key=, secret=), or anon=True for a public "
     "bucket", "set the store's credentials in the environment (S3: AWS_ACCESS_KEY_ID and "
     "AWS_SECRET_ACCESS_KEY, or ~/.aws)", None),
    ("check the credentials in storage_options", "check the store's credentials in the "
     "environment (S3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or ~/.aws)", None),
    ("overwrite=True", "--overwrite", "overwrite"),
)


def _in_cli_words(text: str, args: argparse.Namespace) -> str:
    """``text`` with the library's Python advice in this command's options."""
    for python, cli, option in _CLI_WORDS:
        if option is None or hasattr(args, option):
            text = text.replace(python, cli)
    return text


def main(argv: list[str] | None = None) -> int:
    """Run ``pqloader argv...``; return 0 when done, 1 when it failed, 2 for bad usage."""
    shown = warnings.formatwarning
    warnings.formatwarning = _warning  # the library's warnings, as the CLI's other messages
    try:
        return _main(argv)
    finally:
        warnings.formatwarning = shown


def _warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             line: str | None = None) -> str:
    return f"pqloader: warning: {message}\n"


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version and usage errors; return, do not exit
        return 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 2
    try:
        code: int = args.run(args)
        sys.stdout.flush()  # a closed pipe fails here, where it is handled
        return code
    except CommandFailure as exc:
        if exc.code == 2:
            args.parser.print_usage(sys.stderr)
            print(f"{args.parser.prog}: error: {exc}", file=sys.stderr)
        else:
            print(f"pqloader: {exc}", file=sys.stderr)
        return exc.code
    except BrokenPipeError:  # `pqloader inspect ... | head` closed the pipe: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 1
    except (pqloader.PQLoaderError, OSError, pa.ArrowException, ImportError) as exc:
        # (ImportError: a URL whose filesystem is not installed, or no such scheme)
        print(f"pqloader: {_in_cli_words(str(exc), args)}", file=sys.stderr)
        for note in getattr(exc, "__notes__", ()):  # where: the file and row group at fault
            print(f"  {_in_cli_words(note, args)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: what it stopped says so (write leaves its marker)
        print("pqloader: interrupted", file=sys.stderr)
        return 130
