"""How fast does pqloader read W1 from S3 with 20 ms of added latency, against local disk, with a
cold cache and a warm one, and how many requests does an epoch make?

    .venv/bin/python benchmarks/bench_remote.py             # W1 shape, 2M rows, moto + nginx
    .venv/bin/python benchmarks/bench_remote.py --server rgw  # Ceph's RADOS Gateway instead
    .venv/bin/python benchmarks/bench_remote.py --tiny      # seconds: the smoke test's run

The dataset is bench_tabular's (same generator), uploaded to a local S3 server started by this
script (tests/servers.py), behind an nginx that adds ``--latency-ms`` to every request. Each
method runs in a fresh child process (harness.py watches its memory), interleaved across
repeats:

- local: the files on local disk, pqloader shuffled, 2 worker threads (the reference);
- s3-nocache: over the proxy, no cache;
- s3-cold: over the proxy, into an empty cache directory;
- s3-warm: over the proxy, from the cache the s3-cold run just filled (listing only: no GETs).

Each run makes ``--epochs`` epochs (default 2) with one loader. The first is timed from opening
the dataset (listing and footers included) to its last batch: what a fresh process pays.
Importing torch, pqloader and s3fs (~0.7 s on this machine) happens before the clock starts.
The later epochs are timed alone, a job's steady state: for s3-cold they read the cache the
first epoch filled, and make no data GETs (the ``later`` GETs column shows it).
``paired`` is the median over rounds of a method's rate over local's in the same round: steadier
than the ratio of medians on a machine where other work comes and goes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import harness
from bench_tabular import SEED, default_data, ensure_data

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

METHODS = ("local", "s3-nocache", "s3-cold", "s3-warm")


def run_child(method: str, args: argparse.Namespace) -> dict[str, Any]:
    """``--epochs`` epochs of W1 through one pqloader loader: the first timed from opening the
    dataset (a fresh process's whole cost), the later ones alone (a job's steady state)."""
    import time

    import torch  # noqa: F401  (a once-per-process cost: pqloader imports it lazily)

    import pqloader

    options = json.loads(args.storage_options)
    if method != "local":  # a once-per-process cost (~0.7 s here), like importing torch
        import s3fs  # noqa: F401
    t0 = time.perf_counter()
    if method == "local":
        ds = pqloader.ParquetDataset(args.data)
    else:
        cache = None if method == "s3-nocache" else pqloader.Cache(args.cache_dir)
        ds = pqloader.ParquetDataset(args.url, storage_options=options, cache=cache)
    loader = pqloader.DataLoader(ds, batch_size=args.batch_size, shuffle=True, seed=SEED,
                                 num_workers=2)
    out: dict[str, Any] = {"later_seconds": [], "later_io": []}
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        if epoch:
            t0, before = time.perf_counter(), ds.io_stats()
        rows = 0
        for batch in loader:
            rows += len(batch["label"])
        seconds = time.perf_counter() - t0
        if rows != len(ds):
            sys.exit(f"delivered {rows:,} rows in epoch {epoch}; the dataset has {len(ds):,}")
        if epoch == 0:
            out.update(rows=rows, seconds=seconds, io=ds.io_stats())
        else:
            io = ds.io_stats()
            out["later_seconds"].append(seconds)
            out["later_io"].append({k: io[k] - before.get(k, 0) for k in io})
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2, help="epochs per run: the first is timed "
                   "from opening the dataset, the later ones alone (default: 2)")
    p.add_argument("--latency-ms", type=float, default=20)
    p.add_argument("--server", choices=("moto", "rgw"), default="moto")
    p.add_argument("--data", type=Path, help="local dataset folder (default: under the temp dir)")
    p.add_argument("--tiny", action="store_true", help="100k rows, 4 files, 1 repeat")
    p.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--storage-options", default="{}", help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.row_group_size = 65_536
    if args.tiny:
        args.rows, args.files, args.row_group_size, args.repeats = 100_000, 4, 8192, 1
    if args.data is None:
        args.data = default_data(args.rows, args.files, args.row_group_size)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print("CHILD " + json.dumps(run_child(args.child, args)), flush=True)
        return 0
    import servers

    commit = harness.commit()
    ensure_data(args.data, args.rows, args.files, args.row_group_size)
    server_cls = servers.MotoS3 if args.server == "moto" else servers.RadosGateway
    with server_cls() as s3, servers.S3FaultProxy(s3, latency_ms=args.latency_ms) as proxy:
        url = s3.upload_dir(args.data)
        cache_dir = Path(tempfile.mkdtemp(prefix="pqloader-bench-cache-"))
        common = ["--data", str(args.data), "--batch-size", str(args.batch_size), "--url", url,
                  "--epochs", str(args.epochs),
                  "--storage-options", json.dumps(proxy.storage_options),
                  "--cache-dir", str(cache_dir)]

        def run(method: str) -> dict[str, Any]:
            if method == "s3-cold":
                shutil.rmtree(cache_dir, ignore_errors=True)
            elif method == "s3-warm" and not cache_dir.exists():
                harness.run_child(__file__, "s3-cold", common)  # fill it (not measured)
            result = harness.run_child(__file__, method, common)
            if "error" not in result:
                result["rows_per_s"] = result["rows"] / max(result["seconds"], 1e-9)
                if result["later_seconds"]:
                    result["later_rows_per_s"] = result["rows"] / max(
                        statistics.median(result["later_seconds"]), 1e-9)
                    result["later_requests"] = max(io.get("requests", 0)
                                                   for io in result["later_io"])
            return result

        # s3-warm must follow s3-cold: no rotation between those two
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
        for repeat in range(args.repeats):
            for method in METHODS:
                r = run(method)
                runs[method].append(r)
                note = r.get("error") or f"{r['rows_per_s']:,.0f} rows/s, requests " \
                    f"{r['io'].get('requests', 0)}, retries {r['io'].get('retries', 0)}"
                print(f"[{repeat + 1}/{args.repeats}] {method}: {note}", file=sys.stderr)
        shutil.rmtree(cache_dir, ignore_errors=True)

    summary: dict[str, Any] = {}
    for method, results in runs.items():
        errors = [r["error"] for r in results if "error" in r]
        summary[method] = {"runs": results, "errors": errors}
        if results and not errors:
            summary[method].update(
                rows_per_s=statistics.median(r["rows_per_s"] for r in results),
                requests=statistics.median(r["io"].get("requests", 0) for r in results),
                mib=statistics.median(r["io"].get("bytes", 0) for r in results) / 2**20,
                peak_rss_mib=statistics.median(r["peak_rss_mib"] for r in results))
            if all("later_rows_per_s" in r for r in results):
                summary[method].update(
                    later_rows_per_s=statistics.median(r["later_rows_per_s"] for r in results),
                    later_requests=max(r["later_requests"] for r in results))
    later = args.epochs > 1
    keys = ("rows_per_s", "later_rows_per_s") if later else ("rows_per_s",)
    print(f"\nW1 shape over S3 ({args.server} behind nginx adding {args.latency_ms:g} ms per "
          f"request): {args.rows:,} rows, {args.files} files; median of {args.repeats}")
    print(f"{'method':<12}{'rows/s':>12}{'x local':>9}{'paired':>8}"
          + (f"{'later':>12}{'x local':>9}{'paired':>8}" if later else "")
          + f"{'GETs':>7}" + (f"{'later':>7}" if later else "") + f"{'MiB got':>9}{'peak RSS':>10}")
    for method, s in summary.items():
        if "rows_per_s" not in s:
            print(f"{method:<12}  FAILED: {s['errors'][:1]}")
            continue
        row = f"{method:<12}"
        for key in keys:  # x_local(_paired): the first epoch; x_local_later(_paired): later
            name = "x_local" + ("_later" if key != "rows_per_s" else "")
            base = summary["local"].get(key)
            s[name] = s[key] / base if base and key in s else None
            s[name + "_paired"] = harness.paired(s["runs"], [summary["local"]["runs"]], key) \
                if s[name] is not None else None
            row += f"{s[key]:>12,.0f}" if key in s else f"{'-':>12}"
            row += (f"{s[name]:>9.2f}{s[name + '_paired']:>8.2f}" if s[name] is not None
                    else f"{'-':>17}")
        row += f"{s['requests']:>7,.0f}" + (f"{s.get('later_requests', 0):>7,}" if later else "")
        print(row + f"{s['mib']:>9,.0f}{s['peak_rss_mib']:>10,}")
    if later:
        print("rows/s: the first epoch, from opening the dataset in a fresh process; later: the "
              "median of the later epochs of the same loader; GETs: requests in the first "
              "epoch, and the most in a later one")
    print("RESULT " + json.dumps({"benchmark": "remote", "commit": commit, "rows": args.rows,
                                  "server": args.server, "latency_ms": args.latency_ms,
                                  "methods": summary}))
    return 1 if any(s["errors"] for s in summary.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
