"""How close does ``num_workers="auto"`` come to the best hand-set ``num_workers``, on W1, W2, W3?

    .venv/bin/python benchmarks/bench_autotune.py              # W1, W2, W3 at full size
    .venv/bin/python benchmarks/bench_autotune.py --tiny       # a smoke run of a few seconds
    .venv/bin/python benchmarks/bench_autotune.py --workloads w2 --epochs 3 --repeats 3

Each setting runs in its own child process: ``DataLoader(num_workers=N)`` for N in 0, 1, 2
(threads; on this 2-core machine more only adds contention) and ``num_workers="auto"``, each
for ``--epochs`` epochs on one loader (the tuner keeps what it learned across epochs). The
workloads are those of bench_tabular (W1), bench_tokens (W2) and bench_images (W3, with its
FlipCrop transform), on the same generated data. Reported per workload: the best hand setting's
steady rate (the median over the later half of the epochs: page cache warm, and auto's first
comparison of every count, ~7 s, is mostly over; W1's epochs take ~1.2 s on a quiet machine, so
give it ``--epochs 10``), auto's rate over the same epochs and in
epoch 1 (the tuning included), their ratios, and the thread count auto settled on. Beside them
runs the workload's floor (its own benchmark's: decode only, in file order, no shuffle), once
per epoch, so that every setting's steady rate also reads as a ratio to the floor.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness

SEED = 0
HAND = ("w0", "w1", "w2")
SETTINGS = ("floor", *HAND, "auto")
# workload: (bench module, default rows, files, row-group rows, batch size)
WORKLOADS: dict[str, tuple[str, int, int, int, int]] = {
    "w1": ("bench_tabular", 8_000_000, 16, 65_536, 4096),
    "w2": ("bench_tokens", 1_000_000, 8, 8_192, 64),
    "w3": ("bench_images", 200_000, 8, 5_000, 256),
}
TINY = {"w1": (100_000, 4, 8_192, 1024), "w2": (20_000, 2, 2_048, 64),
        "w3": (4_000, 2, 1_000, 128)}


def shape(workload: str, tiny: bool) -> tuple[int, int, int, int]:
    """(rows, files, row-group rows, batch size)."""
    return TINY[workload] if tiny else WORKLOADS[workload][1:]


def data_path(workload: str, tiny: bool, root: Path | None) -> Path:
    rows, files, group, _ = shape(workload, tiny)
    name = {"w1": "tabular", "w2": "tokens", "w3": "images"}[workload]
    base = root if root is not None else Path(tempfile.gettempdir())
    return base / f"pqloader-bench-{name}-{rows}x{files}-{group}"


def ensure(workload: str, tiny: bool, root: Path | None) -> Path:
    module = __import__(WORKLOADS[workload][0])
    rows, files, group, _ = shape(workload, tiny)
    path = data_path(workload, tiny, root)
    module.ensure_data(path, rows, files, group)
    return path


# -- the child: one setting, several epochs --------------------------------------------------
def _units(workload: str, batch: dict[str, Any]) -> int:
    """What the workload counts: rows (W1, W3) or real tokens (W2)."""
    if workload == "w2":
        return int(batch["tokens_lengths"].sum())
    return len(batch["label"])


def run_floor(workload: str, args: argparse.Namespace) -> dict[str, Any]:
    """The workload's floor (its own benchmark's), once per epoch: decode only, no shuffle."""
    path = data_path(workload, args.tiny, args.data)
    *_, batch_size = shape(workload, args.tiny)
    module = __import__(WORKLOADS[workload][0])
    floor_args = argparse.Namespace(batch_size=batch_size, epochs=1)  # this loop: the epochs
    rates = []
    for _ in range(args.epochs):
        if workload == "w3":
            r = module.run_floor(path, floor_args, "threads")
        else:
            r = module.run_floor(path, floor_args)
        rates.append(r["tokens" if workload == "w2" else "rows"] / r["seconds"])
    return {"rates": rates}


def run_setting(workload: str, setting: str, args: argparse.Namespace) -> dict[str, Any]:
    import pqloader

    if setting == "floor":
        return run_floor(workload, args)
    path = data_path(workload, args.tiny, args.data)
    *_, batch_size = shape(workload, args.tiny)
    options: dict[str, Any] = {}
    if workload == "w3":
        options["transform"] = __import__("bench_images").FlipCrop("image")
    num_workers: Any = "auto" if setting == "auto" else int(setting[1:])
    ds = pqloader.ParquetDataset(path)
    loader = pqloader.DataLoader(ds, batch_size=batch_size, shuffle=True, seed=SEED,
                                 num_workers=num_workers, **options)
    rates, rows = [], 0
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        t0, units, rows = time.perf_counter(), 0, 0
        for batch in loader:
            units += _units(workload, batch)
            rows += len(batch["label"])
        rates.append(units / (time.perf_counter() - t0))
    if rows != len(ds):
        sys.exit(f"delivered {rows:,} rows in the last epoch; the dataset has {len(ds):,}")
    report = loader.autotune
    return {"rates": rates, "threads": None if report is None else report.settled,
            "tried": None if report is None else {str(k): v for k, v in report.rates.items()}}


# -- the parent --------------------------------------------------------------------------------
def child_argv(args: argparse.Namespace) -> list[str]:
    argv = ["--epochs", str(args.epochs)] + (["--tiny"] if args.tiny else [])
    return argv + (["--data", str(args.data)] if args.data else [])


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per setting: the steady rate (over the later half of the epochs, once the
    tuner has settled; the only epoch if just one) and the rate of epoch 1."""
    out: dict[str, Any] = {}
    for setting, results in runs.items():
        ok = [r for r in results if "error" not in r]
        s: dict[str, Any] = {"errors": [r["error"] for r in results if "error" in r]}
        if ok:
            later = [statistics.median(r["rates"][len(r["rates"]) // 2:]) for r in ok]
            s.update(rate=statistics.median(later),
                     first_epoch=statistics.median(r["rates"][0] for r in ok),
                     peak_rss_mib=round(statistics.median(r["peak_rss_mib"] for r in ok)))
            if setting == "auto":
                s["threads"] = [r["threads"] for r in ok]
        out[setting] = s
    floor = out.get("floor", {}).get("rate")
    for s in out.values():
        if floor and "rate" in s:
            s["x_floor"] = s["rate"] / floor
    hand = {k: v["rate"] for k, v in out.items() if k in HAND and "rate" in v}
    if hand and "rate" in out.get("auto", {}):
        best = max(hand, key=hand.__getitem__)
        out["auto"].update(best_hand=best, x_best=out["auto"]["rate"] / hand[best],
                           x_best_first_epoch=out["auto"]["first_epoch"] / hand[best])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="w1,w2,w3", help="comma-separated among w1, w2, w3")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3, help="runs per setting; medians reported")
    p.add_argument("--data", type=Path, help="folder for the datasets (default: the temp dir)")
    p.add_argument("--tiny", action="store_true",
                   help="tiny datasets, floor, w0 and auto only, 2 epochs, 1 repeat: a smoke run")
    p.add_argument("--child", help=argparse.SUPPRESS)  # WORKLOAD:SETTING
    args = p.parse_args(argv)
    if args.tiny:
        args.epochs, args.repeats = 2, 1
    if args.child:
        workload, setting = args.child.split(":")
        print("CHILD " + json.dumps(run_setting(workload, setting, args)), flush=True)
        return 0
    commit = harness.commit()
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if unknown := sorted(set(workloads) - set(WORKLOADS)):
        p.error(f"unknown workloads {unknown}; choose among {', '.join(WORKLOADS)}")
    result: dict[str, Any] = {"benchmark": "autotune", "commit": commit, "epochs": args.epochs,
                              "repeats": args.repeats}
    print(f"num_workers='auto' against hand-set thread workers; {args.epochs} epochs per run, "
          f"median of {args.repeats}; rate: median over epochs "
          f"{args.epochs // 2 + 1}..{args.epochs} (steady: auto has settled)")
    print(f"{'workload':<9}{'setting':<8}{'rate':>14}{'epoch 1':>14}{'x floor':>9}{'x best':>8}"
          f"{'x best (ep 1)':>15}{'threads':>9}{'RSS MiB':>9}")
    for workload in workloads:
        ensure(workload, args.tiny, args.data)
        settings = ["floor", "w0", "auto"] if args.tiny else list(SETTINGS)  # tiny: a smoke run
        runs = harness.interleave(
            settings, args.repeats,
            lambda s, w=workload: harness.run_child(__file__, f"{w}:{s}", child_argv(args)),
            lambda r: "rates " + ", ".join(f"{x:,.0f}" for x in r["rates"]))
        summary = summarise(runs)
        result[workload] = summary
        for setting, s in summary.items():
            if "rate" not in s:
                print(f"{workload:<9}{setting:<8}  FAILED: {s['errors'][0]}")
                continue
            x = f"{s['x_best']:.2f}" if "x_best" in s else ""
            x1 = f"{s['x_best_first_epoch']:.2f}" if "x_best" in s else ""
            threads = ",".join("-" if t is None else str(t) for t in s.get("threads", []))
            xf = f"{s['x_floor']:.2f}" if "x_floor" in s else ""
            print(f"{workload:<9}{setting:<8}{s['rate']:>14,.0f}{s['first_epoch']:>14,.0f}"
                  f"{xf:>9}{x:>8}{x1:>15}{threads:>9}{s['peak_rss_mib']:>9,}")
    print("floor: the workload's own benchmark's floor (decode only, in file order), once per "
          "epoch")
    print("rate: rows/s (w1, w3) or real tokens/s (w2); x best: auto over the best hand "
          "setting's rate; threads: what auto settled on in each run (-: still comparing)")
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
