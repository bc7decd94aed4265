"""How long from opening a dataset of 2,000 small files to the first shuffled batch, with the
manifest that ``write_dataset`` writes (no footer read) and without it (every footer read)?

    .venv/bin/python benchmarks/bench_startup.py            # 2,000 files x 2,000 rows
    .venv/bin/python benchmarks/bench_startup.py --tiny     # seconds: the smoke test's run

The data: 2,000 files written by ``pqloader.write_dataset`` (8 float32 columns + an int64
label, 500-row groups: 8,000 row groups, 4M rows) in ``DATA/manifest``, and the same files
hard-linked (copied where links fail) into ``DATA/footers`` without the manifest. The targets
(issue 4, "Start-up"): the first batch within 2 s without a manifest and 0.5 s with one.

Each measurement runs in a fresh child process (this script with ``--child METHOD``), which
imports torch and pqloader before its clock starts (the import is timed too, and reported
apart), then times ``ParquetDataset(path)`` (open), ``DataLoader(ds, batch_size=4096,
shuffle=True, num_workers=N)`` (loader) and ``next(iter(loader))`` (first batch). The floor is
pyarrow's own: ``pyarrow.dataset.dataset(path)`` and its first batch of 4096 rows, in file
order, unshuffled. Methods are interleaved across repeats so that the machine's noise hits them
all alike; the table shows medians, then one ``RESULT {json}`` line holds every number.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
import numpy as np
import pyarrow as pa

METHODS = ("floor", "manifest-w0", "manifest-w2", "footers-w0", "footers-w2")
TARGET_S = {"manifest": 0.5, "footers": 2.0}  # issue 4's targets for the first batch
MANIFEST = "_pqloader_manifest.json"
SEED = 0


# -- data -------------------------------------------------------------------------------------
def _batches(args: argparse.Namespace) -> Any:
    """Seeded record batches of one row group each: never the whole dataset in memory."""
    rng = np.random.default_rng(SEED)
    names = [f"f{j:02d}" for j in range(args.features)] + ["label"]
    rows = args.files * args.rows_per_file
    for start in range(0, rows, args.row_group_size):
        n = min(args.row_group_size, rows - start)
        features = rng.standard_normal((args.features, n), dtype=np.float32)
        label = rng.integers(0, 10, n, dtype=np.int64)
        yield pa.RecordBatch.from_arrays([pa.array(c) for c in [*features, label]], names=names)


def _complete(folder: Path, args: argparse.Namespace, manifest: bool) -> bool:
    parts = list(folder.glob("part-*.parquet"))
    return len(parts) == args.files and (folder / MANIFEST).is_file() == manifest


def ensure_data(args: argparse.Namespace) -> tuple[Path, Path]:
    """The folders with and without the manifest, written unless they already hold the data."""
    with_manifest, without = args.data / "manifest", args.data / "footers"
    spec = args.data / "spec.json"
    wanted = {k: getattr(args, k) for k in ("files", "rows_per_file", "row_group_size",
                                            "features")}
    if spec.is_file() and json.loads(spec.read_text()) == wanted and \
            _complete(with_manifest, args, True) and _complete(without, args, False):
        print(f"reusing {args.data}", file=sys.stderr)
        return with_manifest, without
    import pqloader

    print(f"writing {args.files:,} files into {args.data} ...", file=sys.stderr)
    t0 = time.perf_counter()
    shutil.rmtree(args.data, ignore_errors=True)
    pqloader.write_dataset(_batches(args), with_manifest, rows_per_file=args.rows_per_file,
                           row_group_size=args.row_group_size, progress=False)
    without.mkdir(parents=True)
    for part in sorted(with_manifest.glob("part-*.parquet")):
        try:  # the same inodes: both folders read the same bytes from the page cache
            os.link(part, without / part.name)
        except OSError:
            shutil.copy2(part, without / part.name)
    spec.write_text(json.dumps(wanted))
    print(f"  written in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return with_manifest, without


# -- the children -----------------------------------------------------------------------------
def run_floor(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """pyarrow.dataset: list the folder, then its first batch in file order (no shuffle)."""
    import pyarrow.dataset as pads

    t0 = time.perf_counter()
    dataset = pads.dataset(path, format="parquet")
    t1 = time.perf_counter()
    taken, rows = [], 0
    for batch in dataset.to_batches(batch_size=args.batch_size):  # one row group's at most
        taken.append(batch.slice(0, args.batch_size - rows))
        rows += taken[-1].num_rows
        if rows == args.batch_size:
            break
    first = pa.Table.from_batches(taken).combine_chunks()
    t2 = time.perf_counter()
    return {"open_s": t1 - t0, "loader_s": 0.0, "first_batch_s": t2 - t1, "seconds": t2 - t0,
            "batch_rows": first.num_rows}


def run_pqloader(path: Path, args: argparse.Namespace, num_workers: int) -> dict[str, Any]:
    """ParquetDataset, DataLoader and the first shuffled batch, each timed."""
    import torch  # noqa: F401  (a once-per-process cost, as before: pqloader imports it lazily)

    import pqloader

    t0 = time.perf_counter()
    ds = pqloader.ParquetDataset(path)
    t1 = time.perf_counter()
    loader = pqloader.DataLoader(ds, batch_size=args.batch_size, shuffle=True, seed=SEED,
                                 num_workers=num_workers)
    t2 = time.perf_counter()
    batches = iter(loader)
    batch = next(batches)
    t3 = time.perf_counter()
    batches.close()  # stops the worker threads
    if len(ds) != args.files * args.rows_per_file or len(ds.files) != args.files:
        sys.exit(f"opened {len(ds.files)} files, {len(ds):,} rows; expected {args.files} files "
                 f"of {args.rows_per_file:,} rows")
    return {"open_s": t1 - t0, "loader_s": t2 - t1, "first_batch_s": t3 - t2,
            "seconds": t3 - t0, "batch_rows": len(batch["label"])}


def child(method: str, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    import pyarrow.parquet  # noqa: F401  # what a training script has imported already
    import torch  # noqa: F401

    import pqloader  # noqa: F401

    import_s = time.perf_counter() - t0
    kind, _, workers = method.partition("-w")
    if method == "floor":
        result = run_floor(args.data / "footers", args)
    else:
        result = run_pqloader(args.data / kind, args, int(workers))
    return {**result, "import_s": import_s}


# -- the parent: run, watch, summarise --------------------------------------------------------
def child_argv(args: argparse.Namespace) -> list[str]:
    return ["--data", str(args.data), "--batch-size", str(args.batch_size), "--files",
            str(args.files), "--rows-per-file", str(args.rows_per_file)]


def summarise(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace
              ) -> dict[str, Any]:
    """Per method: the medians of each phase, the ratio to its target and to the floor."""
    out: dict[str, Any] = {}
    for method, results in runs.items():
        ok = [r for r in results if "error" not in r]
        errors = [r["error"] for r in results if "error" in r]
        errors += [f"a first batch of {r['batch_rows']} rows, expected {args.batch_size}"
                   for r in ok if r["batch_rows"] != args.batch_size]
        s: dict[str, Any] = {"runs": results, "errors": errors}
        if ok:
            s.update({key: statistics.median(r[key] for r in ok)
                      for key in ("import_s", "open_s", "loader_s", "first_batch_s", "seconds")})
            s["seconds_max"] = max(r["seconds"] for r in ok)
            s["peak_rss_mib"] = round(statistics.median(r["peak_rss_mib"] for r in ok))
            target = TARGET_S.get(method.partition("-w")[0])
            s["target_s"] = target
            s["x_target"] = None if target is None else s["seconds"] / target
        out[method] = s
    floor = out.get("floor", {}).get("seconds")
    for s in out.values():
        if "seconds" in s:
            s["x_floor"] = s["seconds"] / floor if floor else None
    return out


def print_table(summary: dict[str, Any], args: argparse.Namespace) -> None:
    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    rows = args.files * args.rows_per_file
    print(f"\ntime to the first batch: {args.files:,} files x {args.rows_per_file:,} rows "
          f"({rows:,}) x {args.features} float32 + int64 label, {args.row_group_size:,}-row "
          f"groups, batch {args.batch_size}, shuffled; median of {args.repeats}")
    print(f"{'method':<13}{'open s':>8}{'loader s':>10}{'1st batch s':>13}{'total s':>9}"
          f"{'max s':>7}{'target s':>10}{'x target':>10}{'x floor':>9}{'import s':>10}"
          f"{'peak RSS MiB':>14}")
    for method, s in summary.items():
        if "seconds" not in s:
            print(f"{method:<13}  FAILED: {s['errors'][0]}")
            continue
        print(f"{method:<13}{s['open_s']:>8.3f}{s['loader_s']:>10.3f}{s['first_batch_s']:>13.3f}"
              f"{s['seconds']:>9.3f}{s['seconds_max']:>7.2f}{num(s['target_s'], '.1f'):>10}"
              f"{num(s['x_target'], '.2f'):>10}{num(s['x_floor'], '.1f'):>9}"
              f"{s['import_s']:>10.2f}{s['peak_rss_mib']:>14,}")
        for error in s["errors"]:
            print(f"{'':<13}  FAILED: {error}")
    print("total: open + loader + first batch, in a fresh process with torch and pqloader "
          "imported before the clock (import s: that import, not counted); manifest: the folder "
          "as write_dataset left it; footers: the same files without the manifest; floor: "
          "pyarrow.dataset's first batch, unshuffled, no footer read up front. Files in the "
          "page cache.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--rows-per-file", type=int, default=2000)
    p.add_argument("--batch-size", type=int, help="default 4096 (256 with --tiny)")
    p.add_argument("--repeats", type=int, default=5, help="runs per method; medians reported")
    p.add_argument("--methods", default=",".join(METHODS),
                   help="comma-separated, among " + ", ".join(METHODS))
    p.add_argument("--data", type=Path, help="folder for the two datasets, reused when it holds "
                   "the same ones (default: one under the temp dir)")
    p.add_argument("--tiny", action="store_true",
                   help="40 files x 200 rows, 50-row groups, batch 256, 1 repeat: a smoke run")
    p.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.features, args.row_group_size = 8, 500
    if args.tiny:
        args.files, args.rows_per_file, args.row_group_size, args.repeats = 40, 200, 50, 1
        args.batch_size = args.batch_size or 256
    args.batch_size = args.batch_size or 4096
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if unknown := sorted(set(args.methods) - set(METHODS)):
        p.error(f"unknown methods {unknown}; choose among {', '.join(METHODS)}")
    if args.data is None:
        args.data = Path(tempfile.gettempdir()) / (
            f"pqloader-bench-startup-{args.files}x{args.rows_per_file}-{args.row_group_size}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print("CHILD " + json.dumps(child(args.child, args)), flush=True)
        return 0
    import pqloader

    commit = harness.commit()  # before the runs: others may commit while they go on
    package = Path(pqloader.__file__).parent
    ensure_data(args)
    runs = harness.interleave(args.methods, args.repeats,
                              lambda m: harness.run_child(__file__, m, child_argv(args)),
                              lambda r: f"{r['seconds']:.3f} s (open {r['open_s']:.3f} s)")
    summary = summarise(runs, args)
    print_table(summary, args)
    print("RESULT " + json.dumps({
        "benchmark": "startup", "commit": commit, "pqloader": str(package),
        "pqloader_modified": harness.modified(package), "files": args.files,
        "rows_per_file": args.rows_per_file, "row_group_size": args.row_group_size,
        "features": args.features, "batch_size": args.batch_size, "repeats": args.repeats,
        "methods": summary,
    }))
    return 1 if any(s["errors"] for s in summary.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
