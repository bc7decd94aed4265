"""How fast does pqloader deliver shuffled tabular batches, against the pyarrow decode floor, the
naive tutorial way (pandas in memory + a map-style Dataset + torch's DataLoader) and the peers?

    .venv/bin/python benchmarks/bench_tabular.py            # 8M rows x 32 float32 + label
    .venv/bin/python benchmarks/bench_tabular.py --tiny     # seconds: the smoke test's run
    .venv/bin/python benchmarks/bench_tabular.py --peers    # + every peer (opt-in: see below)
    .venv/bin/python benchmarks/bench_tabular.py --features 3000 --feature-types float32,int64 \
        --rows 200000 --batch-size 32 --methods floor,pqloader-w2,pqloader-w2-proc   # wide

Peers (opt-in: ``--peers`` adds them all, ``--methods`` picks some): hf-map, hf-map-batched and
hf-stream (Hugging Face ``datasets``), petastorm, mosaic (MosaicML Streaming over MDS), ray
(Ray Data) and lance. Each runs in its own venv under ``.venv-peers/``, which the first run makes
(pip, minutes); conversions (MDS, Lance, the ``datasets`` cache) are made once beside the data,
timed, and reused. A peer is timed after its first batch for up to ``--peer-seconds``.

Each method runs in a fresh child process (this script with ``--child METHOD``); the parent
samples the memory of the child's process tree (the child and its workers) every 20 ms. Methods
are interleaved across repeats so that the machine's noise hits them all alike; the table shows
medians and ratios, then one ``RESULT {json}`` line holds every number.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
import numpy as np
import peer_loaders
import pyarrow as pa
import pyarrow.parquet as pq

METHODS = ("floor", "naive-w0", "naive-w2", "pqloader-w0", "pqloader-w2", "pqloader-auto",
           "pqloader-w2-proc")
PEER_METHODS = tuple(peer_loaders.METHODS)  # opt-in: --peers
NUM_FEATURES = 32
SEED = 0


# -- data -------------------------------------------------------------------------------------
def _batches(rows: int, row_group_size: int, features: int = NUM_FEATURES,
             types: tuple[str, ...] = ("float32",)) -> Any:
    """Seeded record batches of ``row_group_size`` rows: never the whole dataset in memory.
    Feature ``j`` is of ``types[j % len(types)]`` (a wide table of mixed types: ``--features``)."""
    rng = np.random.default_rng(SEED)
    names = [f"f{j:02d}" for j in range(features)] + ["label"]
    for start in range(0, rows, row_group_size):
        n = min(row_group_size, rows - start)
        values = rng.standard_normal((features, n), dtype=np.float32)
        columns = [pa.array(c.astype(types[j % len(types)], copy=False) if types != ("float32",)
                            else c) for j, c in enumerate(values)]
        label = rng.integers(0, 10, n, dtype=np.int64)
        yield pa.RecordBatch.from_arrays([*columns, pa.array(label)], names=names)


def default_data(rows: int, files: int, row_group_size: int, features: int = NUM_FEATURES,
                 types: tuple[str, ...] = ("float32",)) -> Path:
    """W1's folder under the temp dir: the benchmarks that read W1 share it (and its pages)."""
    shape = "" if (features, types) == (NUM_FEATURES, ("float32",)) else \
        f"-{features}{'-'.join(types)}"
    return Path(tempfile.gettempdir()) / \
        f"pqloader-bench-tabular-{rows}x{files}-{row_group_size}{shape}"


def ensure_data(path: Path, rows: int, files: int, row_group_size: int,
                features: int = NUM_FEATURES, types: tuple[str, ...] = ("float32",)) -> None:
    """Write the dataset into ``path`` unless it already holds it (same rows, files, columns)."""
    rows_per_file = -(-rows // files)
    parts = sorted(path.glob("part-*.parquet"))
    finished = not (path / "_pqloader_incomplete").exists()  # a write killed: written again
    if finished and len(parts) == -(-rows // rows_per_file) and \
            sum(pq.read_metadata(p).num_rows for p in parts) == rows and \
            pq.read_metadata(parts[0]).num_columns == features + 1:
        print(f"reusing {path}", file=sys.stderr)
        return
    import pqloader

    print(f"writing {rows:,} rows into {path} ...", file=sys.stderr)
    t0 = time.perf_counter()
    pqloader.write_dataset(_batches(rows, row_group_size, features, types), path,
                           rows_per_file=rows_per_file,
                           row_group_size=row_group_size, overwrite=True)
    print(f"  written in {time.perf_counter() - t0:.0f} s", file=sys.stderr)


# -- the methods, each run in a child process -------------------------------------------------
def run_floor(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The pyarrow decode floor: every row group to numpy, in file order, no shuffle; the same
    passes again for ``--epochs``, each timed alone."""
    out: dict[str, Any] = {"later_seconds": []}
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        rows = label_sum = 0
        for file in sorted(path.glob("*.parquet")):
            pf = pq.ParquetFile(file)
            for i in range(pf.num_row_groups):
                table = pf.read_row_group(i, use_threads=True)
                columns = {name: table.column(name).to_numpy() for name in table.column_names}
                rows += table.num_rows
                label_sum += int(columns["label"].sum())
        seconds = time.perf_counter() - t0
        if epoch == 0:
            out.update(rows=rows, seconds=seconds, label_sum=label_sum)
        else:
            out["later_seconds"].append(seconds)
    return out


class TutorialDataset:
    """The tutorial way: a map-style dataset over a DataFrame, one ``df.iloc[i]`` per row."""

    def __init__(self, df: Any) -> None:
        self.df = df

    def __len__(self) -> int:
        return len(self.df)

    def __getitem__(self, i: int) -> Any:
        import torch  # imported here so that the floor's child never loads torch

        values = self.df.iloc[i].to_numpy()  # the features, then the label
        return torch.tensor(values[:-1], dtype=torch.float32), int(values[-1])


def run_naive(path: Path, args: argparse.Namespace, num_workers: int) -> dict[str, Any]:
    """pandas + TutorialDataset + torch's DataLoader; ``naive_batches`` batches are timed.

    The clock starts when the first batch arrives (worker start-up is not counted): the
    steady state, which a whole epoch would approach.
    """
    import pandas as pd
    import torch

    t0 = time.perf_counter()
    df = pd.read_parquet(path)
    load_s = time.perf_counter() - t0
    torch.manual_seed(SEED)
    loader = torch.utils.data.DataLoader(TutorialDataset(df), batch_size=args.batch_size,
                                         shuffle=True, num_workers=num_workers)
    batches = iter(loader)
    next(batches)
    rows = 0
    t0 = time.perf_counter()
    for features, labels in itertools.islice(batches, args.naive_batches):
        assert features.shape == (len(labels), args.features)
        rows += len(labels)
    return {"rows": rows, "seconds": time.perf_counter() - t0, "load_s": load_s}


def run_pqloader(path: Path, args: argparse.Namespace, num_workers: int | str,
                 worker_type: str = "thread") -> dict[str, Any]:
    """pqloader's DataLoader, shuffled, every batch consumed. The first epoch is timed from
    opening the dataset (a fresh process's whole cost); the later ones, of the same loader,
    alone (a job's steady state)."""
    import torch  # noqa: F401  (a once-per-process cost, as before: pqloader imports it lazily)

    import pqloader

    out: dict[str, Any] = {"later_seconds": []}
    t0 = time.perf_counter()
    ds = pqloader.ParquetDataset(path)
    loader = pqloader.DataLoader(ds, batch_size=args.batch_size, shuffle=True, seed=SEED,
                                 num_workers=num_workers, worker_type=worker_type)
    for epoch in range(args.epochs):
        if epoch:
            t0 = time.perf_counter()
        loader.set_epoch(epoch)
        rows = label_sum = 0
        for batch in loader:
            rows += len(batch["label"])
            label_sum += int(batch["label"].sum())
        seconds = time.perf_counter() - t0
        if rows != len(ds):
            sys.exit(f"delivered {rows:,} rows in epoch {epoch}; the dataset has {len(ds):,}")
        if epoch == 0:
            out.update(rows=rows, seconds=seconds, label_sum=label_sum)
        else:
            out["later_seconds"].append(seconds)
    return out


def peer_workload(path: Path, args: argparse.Namespace) -> peer_loaders.Workload:
    return peer_loaders.Workload(data=path, out=path.parent / f"{path.name}-peers",
                                 batch_size=args.batch_size, list_column=None, seed=SEED)


def run_peer(path: Path, args: argparse.Namespace, method: str) -> dict[str, Any]:
    """A peer's loader (peer_loaders.py): rows/s after its first batch, for up to
    ``--peer-seconds``; the label sum only when it delivered the whole epoch."""
    w = peer_workload(path, args)
    if args.prepare:
        return peer_loaders.prepare(method, w)

    def consume(batch: dict[str, Any]) -> dict[str, int]:
        return {"rows": len(batch["label"]), "label_sum": int(batch["label"].sum())}

    r = peer_loaders.measure(method, w, consume, args.peer_seconds)
    out = {"rows": r["timed_rows"], "seconds": r["seconds"], "first_batch_s": r["first_batch_s"],
           "whole_epoch": r["whole_epoch"], "epoch_rows": r["rows"] + r["timed_rows"]}
    if r["whole_epoch"]:
        out["label_sum"] = r["label_sum"] + r["timed_label_sum"]
    return out


CHILDREN = {
    "floor": run_floor,
    "naive-w0": lambda p, a: run_naive(p, a, 0),
    "naive-w2": lambda p, a: run_naive(p, a, 2),
    "pqloader-w0": lambda p, a: run_pqloader(p, a, 0),
    "pqloader-w2": lambda p, a: run_pqloader(p, a, 2),
    "pqloader-auto": lambda p, a: run_pqloader(p, a, "auto"),
    "pqloader-w2-proc": lambda p, a: run_pqloader(p, a, 2, "process"),
    **{m: functools.partial(run_peer, method=m) for m in PEER_METHODS},
}


# -- the parent: run, watch, summarise --------------------------------------------------------
def child_argv(path: Path, args: argparse.Namespace) -> list[str]:
    return ["--data", str(path), "--features", str(args.features), "--feature-types",
            ",".join(args.feature_types), "--batch-size", str(args.batch_size), "--epochs",
            str(args.epochs), "--naive-batches", str(args.naive_batches), "--peer-seconds",
            str(args.peer_seconds)]


def run_child(method: str, path: Path, args: argparse.Namespace,
              prepared: dict[str, dict[str, Any]]) -> dict[str, Any]:
    if "error" in prepared.get(method, {}):
        return {"error": prepared[method]["error"]}
    python = prepared[method]["python"] if method in prepared else sys.executable
    result = harness.run_child(__file__, method, child_argv(path, args), python=python)
    if "error" not in result:
        result["rows_per_s"] = result["rows"] / max(result["seconds"], 1e-9)
        if result.get("later_seconds"):
            result["later_rows_per_s"] = result["rows"] / max(
                statistics.median(result["later_seconds"]), 1e-9)
    return result


def summarise(runs: dict[str, list[dict[str, Any]]], rows: int,
              prepared: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per method: median rows/s and peak memory over the runs, ratios, failures; for the
    peers, their conversion and pqloader's ratio to the best `datasets` mode."""
    out: dict[str, Any] = {}
    for method, results in runs.items():
        ok = [r for r in results if "error" not in r]
        errors = [r["error"] for r in results if "error" in r]
        s: dict[str, Any] = {"runs": results, "errors": errors}
        if method in prepared:
            s["convert_s"] = prepared[method].get("convert_s")
        if ok:
            s.update(rows_per_s=statistics.median(r["rows_per_s"] for r in ok),
                     peak_rss_mib=round(statistics.median(r["peak_rss_mib"] for r in ok)),
                     peak_pss_mib=round(statistics.median(r["peak_pss_mib"] for r in ok)),
                     peak_rss_mib_max=max(r["peak_rss_mib"] for r in ok))
            if all("later_rows_per_s" in r for r in ok):
                s["later_rows_per_s"] = statistics.median(r["later_rows_per_s"] for r in ok)
            if method.startswith("naive"):
                s["load_s"] = statistics.median(r["load_s"] for r in ok)
            elif method in PEER_METHODS:
                s["first_batch_s"] = statistics.median(r["first_batch_s"] for r in ok)
                if bad := [r["epoch_rows"] for r in ok if r["whole_epoch"] and
                           r["epoch_rows"] != rows]:
                    errors.append(f"delivered {bad} rows in an epoch, expected {rows}")
            elif any(r["rows"] != rows for r in ok):
                errors.append(f"delivered {[r['rows'] for r in ok]} rows, expected {rows}")
        out[method] = s
    floor = out.get("floor", {}).get("rows_per_s")
    naive = [s["rows_per_s"] for m, s in out.items() if m.startswith("naive") and "rows_per_s" in s]
    sums = {r["label_sum"] for s in out.values() for r in s["runs"] if "label_sum" in r}
    floor_runs = [out["floor"]["runs"]] if floor else []
    for s in out.values():
        if "rows_per_s" in s:
            s["x_floor"] = s["rows_per_s"] / floor if floor else None
            s["x_floor_paired"] = harness.paired(s["runs"], floor_runs, "rows_per_s")
            s["x_best_naive"] = s["rows_per_s"] / max(naive) if naive else None
        if "later_rows_per_s" in s:
            later_floor = out.get("floor", {}).get("later_rows_per_s")
            s["x_floor_later"] = s["later_rows_per_s"] / later_floor if later_floor else None
            s["x_floor_later_paired"] = harness.paired(s["runs"], floor_runs, "later_rows_per_s")
        if len(sums) > 1 and any("label_sum" in r for r in s["runs"]):
            s["errors"].append(f"label sums differ between methods: {sorted(sums)}")
    hf = {m: s["rows_per_s"] for m, s in out.items() if m.startswith("hf-") and "rows_per_s" in s}
    if hf:
        best = max(hf, key=hf.__getitem__)
        for s in out.values():
            if "rows_per_s" in s:
                s["x_best_hf"], s["best_hf"] = s["rows_per_s"] / hf[best], best
    return out


def print_table(summary: dict[str, Any], args: argparse.Namespace) -> None:
    def ratio(x: float | None) -> str:  # small ratios keep two significant digits
        if x is None:
            return "-"
        return f"{x:,.0f}" if x >= 100 else f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"

    print(f"\nshuffled tabular batches: {args.rows:,} rows x {args.features} "
          f"{'/'.join(args.feature_types)} + int64 "
          f"label, {args.files} files, {args.row_group_size:,}-row groups, batch "
          f"{args.batch_size}; median of {args.repeats}")
    hf = any("x_best_hf" in s for s in summary.values())
    later = any("later_rows_per_s" in s for s in summary.values())
    print(f"{'method':<18}{'rows/s':>12}{'x floor':>9}{'paired':>8}"
          + (f"{'later':>12}{'x floor':>9}{'paired':>8}" if later else "") + f"{'x naive':>9}"
          + (f"{'x hf':>9}" if hf else "") + f"{'peak RSS MiB':>14}{'peak PSS MiB':>14}")
    for method, s in summary.items():
        if "rows_per_s" not in s:
            print(f"{method:<18}  FAILED: {s['errors'][0]}")
            continue
        star = "*" if method.startswith("naive") else "+" if method in PEER_METHODS else ""
        steady = (f"{s['later_rows_per_s']:>12,.0f}{ratio(s['x_floor_later']):>9}"
                  f"{ratio(s['x_floor_later_paired']):>8}" if "later_rows_per_s" in s
                  else f"{'-':>12}{'-':>9}{'-':>8}") if later else ""
        print(f"{method + star:<18}{s['rows_per_s']:>12,.0f}{ratio(s['x_floor']):>9}"
              f"{ratio(s['x_floor_paired']):>8}{steady}{ratio(s['x_best_naive']):>9}"
              + (f"{ratio(s['x_best_hf']):>9}" if hf else "")
              + f"{s['peak_rss_mib']:>14,}{s['peak_pss_mib']:>14,}")
    if any(m.startswith("naive") for m in summary):
        loads = ", ".join(f"{m} {s['load_s']:.1f} s" for m, s in summary.items() if "load_s" in s)
        print(f"* naive: rows/s over {args.naive_batches} batches after the first; the load "
              f"(pd.read_parquet) and the first batch are not counted ({loads})")
    if peers := [m for m in summary if m in PEER_METHODS]:
        print(peer_note(summary, peers, args.peer_seconds, "rows"))
    print("floor: pyarrow decode to numpy, no shuffle; paired: the median over rounds of the "
          "ratio to the floor of the same round; pqloader: shuffled, every row, timed from "
          "opening the dataset" + ("; later: the median of the later epochs of the same "
          "process (the floor) or loader (pqloader), timed alone" if later else "")
          + ". Peak memory of the process tree, median of the runs' peaks: RSS counts shared "
          "pages once per process, PSS splits them.")


def peer_note(summary: dict[str, Any], peers: list[str], seconds: float, unit: str) -> str:
    """The footnote on the peers: how they were timed, their conversions and start-up."""
    def start(m: str) -> str:
        s = summary[m]
        parts = [f"first batch {s['first_batch_s']:.1f} s"] if "first_batch_s" in s else []
        if s.get("convert_s") is not None:
            parts.insert(0, f"conversion {s['convert_s']:.0f} s")
        return f"{m} {', '.join(parts)}" if parts else ""

    best = next((s["best_hf"] for s in summary.values() if "best_hf" in s), None)
    return (f"+ peers: {unit}/s after the first batch, until the epoch ends or {seconds:g} s; "
            "not counted: " + "; ".join(filter(None, map(start, peers)))
            + (f". x hf: against the best `datasets` mode ({best})" if best else ""))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=8_000_000)
    p.add_argument("--files", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3, help="runs per method; medians reported")
    p.add_argument("--epochs", type=int, default=2, help="epochs per run of the floor and "
                   "pqloader: the first timed from opening the dataset in a fresh process, the "
                   "later ones alone (default: 2)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated, among "
                   + ", ".join(METHODS + PEER_METHODS) + " (default: all but the peers)")
    p.add_argument("--peers", action="store_true", help="add every peer: "
                   + ", ".join(PEER_METHODS) + "; each runs in its own venv under "
                   ".venv-peers/, which the first run makes with pip (minutes)")
    p.add_argument("--peer-seconds", type=float, default=30,
                   help="time each peer for at most this long after its first batch")
    p.add_argument("--data", type=Path, help="dataset folder, reused when it holds the same "
                   "rows and files (default: one under the temp dir)")
    p.add_argument("--row-group-size", type=int, default=65_536,
                   help="rows per row group of the data written (default: 65,536)")
    p.add_argument("--features", type=int, default=NUM_FEATURES,
                   help=f"feature columns beside the label (default: {NUM_FEATURES})")
    p.add_argument("--feature-types", default="float32", help="numpy types the features take "
                   "in turn, comma-separated (default: float32); e.g. float32,int64 for a wide "
                   "table of mixed types")
    p.add_argument("--tiny", action="store_true",
                   help="100k rows, 4 files, 8192-row groups, 1 repeat: a smoke run")
    p.add_argument("--naive-batches", type=int, default=40, help=argparse.SUPPRESS)
    p.add_argument("--child", choices=METHODS + PEER_METHODS, help=argparse.SUPPRESS)
    p.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tiny:
        args.rows, args.files, args.row_group_size, args.repeats = 100_000, 4, 8192, 1
        args.naive_batches = min(args.naive_batches, 5)
        args.peer_seconds = min(args.peer_seconds, 5)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if args.peers:
        args.methods += [m for m in PEER_METHODS if m not in args.methods]
    if unknown := sorted(set(args.methods) - set(METHODS + PEER_METHODS)):
        p.error(f"unknown methods {unknown}; choose among {', '.join(METHODS + PEER_METHODS)}")
    args.feature_types = tuple(t.strip() for t in args.feature_types.split(","))
    if args.data is None:
        args.data = default_data(args.rows, args.files, args.row_group_size, args.features,
                                 args.feature_types)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print("CHILD " + json.dumps(CHILDREN[args.child](args.data, args)), flush=True)
        return 0
    import peers  # the parent's only: it makes the peers' venvs
    commit = harness.commit()  # before the runs: others may commit while they go on
    ensure_data(args.data, args.rows, args.files, args.row_group_size, args.features,
                args.feature_types)
    prepared = peers.prepare(__file__, [m for m in args.methods if m in PEER_METHODS],
                             child_argv(args.data, args), peer_loaders.METHODS)
    runs = harness.interleave(args.methods, args.repeats,
                              lambda m: run_child(m, args.data, args, prepared),
                              lambda r: f"{r['rows_per_s']:,.0f} rows/s")
    summary = summarise(runs, args.rows, prepared)
    print_table(summary, args)
    print("RESULT " + json.dumps({
        "benchmark": "tabular", "commit": commit, "rows": args.rows, "files": args.files,
        "row_group_size": args.row_group_size, "batch_size": args.batch_size,
        "features": args.features, "feature_types": list(args.feature_types),
        "epochs": args.epochs, "repeats": args.repeats, "naive_batches": args.naive_batches,
        "methods": summary,
    }))
    return 1 if any(s["errors"] for s in summary.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
