"""How fast does pqloader feed a CUDA device, with and without pinned memory, against the same
loader's batches left on the host and the pyarrow decode floor?

    .venv/bin/python benchmarks/bench_device.py              # W1: 8M rows x 32 float32 + label
    .venv/bin/python benchmarks/bench_device.py --tiny       # seconds: the smoke test's run
    .venv/bin/python benchmarks/bench_device.py --num-workers 4 --repeats 5

Methods, each in a fresh child process, interleaved across repeats (see ``harness.py``):

- ``floor``: bench_tabular's pyarrow decode to numpy, in file order, no shuffle;
- ``host``: ``pqloader.DataLoader``, shuffled, batches left where the loader made them;
- ``cuda``: the same, each batch's tensors copied to the device with ``.to("cuda")``
  (pageable memory: the copy blocks the loop and stages through a driver buffer);
- ``cuda-pinned``: ``pin_memory=True`` (the worker threads pin each batch) and
  ``.to("cuda", non_blocking=True)``: the copy is queued and the loop goes on;
- ``cuda-device``: ``device="cuda"``: the worker threads pin each batch and copy it on their
  own CUDA stream, one copy per group of same-dtype, same-shape tensors; batches arrive there.

Each device method sums the labels on the device and synchronises once at the end, so every
copy is waited for and its data checked against the floor's label sum. The device methods are
listed as skipped where torch sees no CUDA device (the smoke test's machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import bench_tabular
import harness

METHODS = ("floor", "host", "cuda", "cuda-pinned", "cuda-device")
DEVICE_METHODS = ("cuda", "cuda-pinned", "cuda-device")
SEED = 0


def run_loader(path: Path, args: argparse.Namespace, method: str) -> dict[str, Any]:
    """One shuffled epoch timed from opening the dataset; ``method`` says where batches go."""
    import torch

    import pqloader

    device = torch.device("cuda") if method in DEVICE_METHODS else None
    pinned = method == "cuda-pinned"
    moved = method == "cuda-device"  # by the loader
    if device is not None:
        torch.zeros(1, device=device)  # the CUDA context (~0.3 s) is not the loader's time
    t0 = time.perf_counter()
    ds = pqloader.ParquetDataset(path)
    workers = args.num_workers if args.num_workers == "auto" else int(args.num_workers)
    loader = pqloader.DataLoader(ds, batch_size=args.batch_size, shuffle=True, seed=SEED,
                                 num_workers=workers, pin_memory=pinned,
                                 device=device if moved else None)
    rows = 0
    label_sum = torch.zeros((), dtype=torch.int64, device=device)
    for batch in loader:
        if device is not None and not moved:
            batch = {k: v.to(device, non_blocking=pinned) for k, v in batch.items()}
        rows += len(batch["label"])
        label_sum += batch["label"].sum()
    total = int(label_sum)  # waits for every queued copy and sum
    seconds = time.perf_counter() - t0
    if rows != len(ds):
        sys.exit(f"delivered {rows:,} rows; the dataset has {len(ds):,}")
    return {"rows": rows, "seconds": seconds, "label_sum": total}


def run_child(method: str, args: argparse.Namespace) -> dict[str, Any]:
    argv = ["--data", str(args.data), "--batch-size", str(args.batch_size),
            "--num-workers", str(args.num_workers)]
    result = harness.run_child(__file__, method, argv)
    if "error" not in result:
        result["rows_per_s"] = result["rows"] / max(result["seconds"], 1e-9)
    return result


def summarise(runs: dict[str, list[dict[str, Any]]], rows: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for method, results in runs.items():
        ok = [r for r in results if "error" not in r]
        s: dict[str, Any] = {"runs": results, "errors": [r["error"] for r in results
                                                         if "error" in r]}
        if ok:
            s.update(rows_per_s=statistics.median(r["rows_per_s"] for r in ok),
                     peak_rss_mib=round(statistics.median(r["peak_rss_mib"] for r in ok)))
            if any(r["rows"] != rows for r in ok):
                s["errors"].append(f"delivered {[r['rows'] for r in ok]} rows, expected {rows}")
        out[method] = s
    sums = {r["label_sum"] for s in out.values() for r in s["runs"] if "label_sum" in r}
    for name, base in (("x_floor", "floor"), ("x_host", "host")):
        base_runs = [out[base]["runs"]] if "rows_per_s" in out.get(base, {}) else []
        for s in out.values():
            if "rows_per_s" in s and base_runs:
                s[name] = harness.paired(s["runs"], base_runs, "rows_per_s")
    if len(sums) > 1:
        for s in out.values():
            s["errors"].append(f"label sums differ between methods: {sorted(sums)}")
    return out


def print_table(summary: dict[str, Any], skipped: dict[str, str],
                args: argparse.Namespace, device: str) -> None:
    print(f"\nW1 to {device}: {args.rows:,} rows x 32 float32 + int64 label, {args.files} "
          f"files, batch {args.batch_size}, num_workers={args.num_workers}; median of "
          f"{args.repeats}")
    print(f"{'method':<14}{'rows/s':>12}{'x floor':>9}{'x host':>8}{'peak RSS MiB':>14}")
    for method, s in summary.items():
        if "rows_per_s" not in s:
            print(f"{method:<14}  FAILED: {s['errors'][0]}")
            continue
        ratios = "".join(f"{s[k]:>{w}.2f}" if s.get(k) is not None else f"{'-':>{w}}"
                         for k, w in (("x_floor", 9), ("x_host", 8)))
        print(f"{method:<14}{s['rows_per_s']:>12,.0f}{ratios}{s['peak_rss_mib']:>14,}")
    for method, why in skipped.items():
        print(f"{method:<14}  skipped: {why}")
    print("x floor, x host: the median over rounds of the rate over the floor's (host's) in "
          "the same round. Every method but the floor shuffles and is timed from opening the "
          "dataset; the device methods until their last copy has landed.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=8_000_000)
    p.add_argument("--files", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--num-workers", default="auto", help='"auto" or a thread count')
    p.add_argument("--repeats", type=int, default=3, help="runs per method; medians reported")
    p.add_argument("--methods", default=",".join(METHODS),
                   help="comma-separated, among " + ", ".join(METHODS))
    p.add_argument("--data", type=Path, help="dataset folder, reused when it holds the same "
                   "rows and files (default: bench_tabular's, under the temp dir)")
    p.add_argument("--tiny", action="store_true",
                   help="100k rows, 4 files, 8192-row groups, 1 repeat: a smoke run")
    p.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.row_group_size = 65_536
    if args.tiny:
        args.rows, args.files, args.row_group_size, args.repeats = 100_000, 4, 8192, 1
    if args.num_workers != "auto" and not args.num_workers.isdigit():
        p.error(f'--num-workers must be "auto" or a count, got {args.num_workers!r}')
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if unknown := sorted(set(args.methods) - set(METHODS)):
        p.error(f"unknown methods {unknown}; choose among {', '.join(METHODS)}")
    if args.data is None:
        args.data = bench_tabular.default_data(args.rows, args.files, args.row_group_size)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        args.epochs = 1  # bench_tabular's floor: one pass, as the loader here makes
        run = bench_tabular.run_floor if args.child == "floor" else \
            lambda path, a: run_loader(path, a, args.child)
        print("CHILD " + json.dumps(run(args.data, args)), flush=True)
        return 0
    import torch

    commit = harness.commit()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    skipped = {m: "torch sees no CUDA device" for m in args.methods
               if m in DEVICE_METHODS and not torch.cuda.is_available()}
    methods = [m for m in args.methods if m not in skipped]
    bench_tabular.ensure_data(args.data, args.rows, args.files, args.row_group_size)
    runs = harness.interleave(methods, args.repeats, lambda m: run_child(m, args),
                              lambda r: f"{r['rows_per_s']:,.0f} rows/s")
    summary = summarise(runs, args.rows)
    print_table(summary, skipped, args, device)
    print("RESULT " + json.dumps({
        "benchmark": "device", "commit": commit, "device": device, "rows": args.rows,
        "files": args.files, "batch_size": args.batch_size, "num_workers": args.num_workers,
        "repeats": args.repeats, "methods": summary, "skipped": skipped,
    }))
    return 1 if any(s["errors"] for s in summary.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
