"""How long from ``load_state_dict`` to the first batch, at 1%, 50% and 99% of an epoch, against
a fresh start (0%) and against the replay way (iterate and discard the batches up to the
position, which is what torchdata's ``StatefulDataLoader`` does)?

    .venv/bin/python benchmarks/bench_resume.py            # W1 of bench_tabular: 8M rows
    .venv/bin/python benchmarks/bench_resume.py --tiny     # seconds: the smoke test's run

The data is bench_tabular's (same generator, same default folder). For each position p and
``num_workers`` N the parent saves a state: a loader's ``state_dict()`` with ``batches = k =
round(p * len(loader))``, the same state a loader saved after k batches holds. Each measurement
runs in a fresh child process (this script with ``--child``), which imports torch and pqloader
before its clock starts:

- restore: build the ``ParquetDataset`` and ``DataLoader``, ``load_state_dict(state)``,
  ``next(iter(loader))``;
- replay: build them, iterate and discard k batches, take the next one.

Both should deliver batch k of the uninterrupted epoch: the restore child checks its batch
against an uninterrupted iteration after its clock stops, and the parent checks that every child
of a (p, N) got the same batch (a SHA-256 of its tensors). Children are interleaved across
repeats so that the machine's noise hits them all alike; the table shows medians and ratios,
then one ``RESULT {json}`` line holds every number.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from bench_tabular import NUM_FEATURES, SEED, default_data, ensure_data

POSITIONS = (0.0, 0.01, 0.5, 0.99)
WORKERS = (0, 2)
KINDS = ("restore", "replay")


# -- the children -----------------------------------------------------------------------------
def _loader(path: Path, args: argparse.Namespace, num_workers: int) -> Any:
    import pqloader

    ds = pqloader.ParquetDataset(path)
    return pqloader.DataLoader(ds, batch_size=args.batch_size, shuffle=True, seed=SEED,
                               num_workers=num_workers)


def digest(batch: dict[str, Any]) -> str:
    """SHA-256 of a batch's tensors (names, shapes, bytes): equal iff the batches are."""
    h = hashlib.sha256()
    for name in sorted(batch):
        t = batch[name].contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


def run_restore(args: argparse.Namespace) -> dict[str, Any]:
    """Restore the saved state in a fresh loader and take one batch; then check that batch."""
    import torch

    state = json.loads(args.state.read_text())
    k = state["batches"]
    t0 = time.perf_counter()
    loader = _loader(args.data, args, args.workers)
    t1 = time.perf_counter()
    loader.load_state_dict(state)
    t2 = time.perf_counter()
    batches = iter(loader)
    batch = next(batches)
    t3 = time.perf_counter()
    batches.close()  # stops the worker threads before the reference run
    out: dict[str, Any] = {"seconds": t3 - t0, "open_s": t1 - t0, "load_state_s": t2 - t1,
                           "first_batch_s": t3 - t2, "batch": k, "digest": digest(batch)}
    # The reference, off the clock: batch k of an uninterrupted iteration of the same epoch.
    reference = _loader(args.data, args, args.workers)
    ref_iter = iter(reference)
    ref = next(itertools.islice(ref_iter, k, None))
    ref_iter.close()
    out["matches_reference"] = batch.keys() == ref.keys() and all(
        torch.equal(batch[n], ref[n]) for n in batch)
    return out


def run_replay(args: argparse.Namespace) -> dict[str, Any]:
    """A fresh loader, iterated from the start: discard k batches, take the next one."""
    k = json.loads(args.state.read_text())["batches"]
    t0 = time.perf_counter()
    loader = _loader(args.data, args, args.workers)
    t1 = time.perf_counter()
    batches = iter(loader)
    for _ in range(k):
        next(batches)
    batch = next(batches)
    t2 = time.perf_counter()
    batches.close()
    return {"seconds": t2 - t0, "open_s": t1 - t0, "first_batch_s": t2 - t1, "batch": k,
            "digest": digest(batch)}


CHILDREN = {"restore": run_restore, "replay": run_replay}


# -- the parent: states, runs, summary --------------------------------------------------------
def save_states(args: argparse.Namespace, folder: Path) -> tuple[dict[tuple[float, int], Path],
                                                                 int]:
    """One state file per (position, workers), and the epoch's batch count."""
    files: dict[tuple[float, int], Path] = {}
    num_batches = 0
    for n in args.workers:
        loader = _loader(args.data, args, n)
        num_batches = len(loader)
        base = loader.state_dict()
        for p in args.positions:
            # At most the last batch: a cursor at len(loader) is an epoch already finished.
            state = dict(base, batches=min(round(p * num_batches), num_batches - 1))
            files[p, n] = folder / f"state-p{p}-w{n}.json"
            files[p, n].write_text(json.dumps(state))
    return files, num_batches


def run_child(kind: str, state: Path, n: int, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", kind, "--state", str(state),
           "--child-workers", str(n), "--data", str(args.data),
           "--batch-size", str(args.batch_size)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("CHILD ")]
    if proc.returncode != 0 or not lines:
        stderr = proc.stderr.strip()
        print(f"{kind} {state.name} failed (exit code {proc.returncode}):\n{stderr}",
              file=sys.stderr)
        return {"error": stderr.splitlines()[-1] if stderr else f"exit code {proc.returncode}"}
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("CHILD "))
    return result


def summarise(runs: dict[tuple[float, int, str], list[dict[str, Any]]],
              args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per (position, workers): medians of both ways, the ratios, and every check's failures."""
    rows = []
    for p, n in itertools.product(args.positions, args.workers):
        row: dict[str, Any] = {"position": p, "workers": n, "errors": []}
        digests = set()
        for kind in KINDS:
            results = runs[p, n, kind]
            ok = [r for r in results if "error" not in r]
            row["errors"] += [f"{kind}: {r['error']}" for r in results if "error" in r]
            row["errors"] += [f"restore: batch {r['batch']} differs from the uninterrupted "
                              "iteration's" for r in ok if r.get("matches_reference") is False]
            digests |= {r["digest"] for r in ok}
            s: dict[str, Any] = {"runs": results}
            if ok:
                row["batch"] = ok[0]["batch"]
                s.update({key: statistics.median(r[key] for r in ok)
                          for key in ok[0] if key.endswith("_s") or key == "seconds"})
            row[kind] = s
        if len(digests) > 1:
            row["errors"].append(f"the children got different batches: {sorted(digests)}")
        restore, replay = row["restore"].get("seconds"), row["replay"].get("seconds")
        row["replay_over_restore"] = replay / restore if restore and replay else None
        rows.append(row)
    for row in rows:  # against the fresh start: position 0, same workers
        fresh = next((r["restore"].get("seconds") for r in rows
                      if r["position"] == 0 and r["workers"] == row["workers"]), None)
        restore = row["restore"].get("seconds")
        row["restore_over_fresh"] = restore / fresh if restore and fresh else None
    return rows


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace, num_batches: int) -> None:
    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    print(f"\ntime to the first batch after a restore: {args.rows:,} rows x {NUM_FEATURES} "
          f"float32 + int64 label, {args.files} files, {args.row_group_size:,}-row groups, batch "
          f"{args.batch_size} ({num_batches:,} per epoch), shuffled; median of {args.repeats}")
    print(f"{'position':>8}{'batch':>7}{'workers':>8}{'restore s':>11}{'open s':>8}"
          f"{'x fresh':>9}{'replay s':>10}{'replay/restore':>16}")
    for r in rows:
        rs, rp = r["restore"], r["replay"]
        print(f"{r['position']:>8.0%}{r.get('batch', '-'):>7}{r['workers']:>8}"
              f"{num(rs.get('seconds'), '.3f'):>11}{num(rs.get('open_s'), '.3f'):>8}"
              f"{num(r['restore_over_fresh'], '.2f'):>9}{num(rp.get('seconds'), '.3f'):>10}"
              f"{num(r['replay_over_restore'], '.1f'):>16}")
        for error in r["errors"]:
            print(f"{'':>8}  FAILED: {error}")
    print("restore: open the dataset and loader (open s, included), load_state_dict, first batch; "
          "replay: open them, iterate and discard `batch` batches, take the next. x fresh: "
          "restore time over the restore at 0% with the same workers. Each in a fresh process, "
          "torch and pqloader imported before the clock; the files in the page cache.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=8_000_000)
    p.add_argument("--files", type=int, default=16)
    p.add_argument("--batch-size", type=int, help="default 4096 (1024 with --tiny)")
    p.add_argument("--repeats", type=int, default=5, help="runs per measurement; medians reported")
    p.add_argument("--positions", help="fractions of the epoch, comma-separated (default: "
                   + ",".join(map(str, POSITIONS)) + "; 0,0.5 with --tiny)")
    p.add_argument("--workers", default=",".join(map(str, WORKERS)),
                   help="num_workers values, comma-separated")
    p.add_argument("--data", type=Path, help="dataset folder, reused when it holds the same "
                   "rows and files (default: bench_tabular's, under the temp dir)")
    p.add_argument("--tiny", action="store_true",
                   help="100k rows, 4 files, 8192-row groups, batch 1024, positions 0 and 0.5, "
                   "1 repeat: a smoke run (each measurement is a fresh process importing torch)")
    p.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    p.add_argument("--state", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--child-workers", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.row_group_size = 65_536
    if args.tiny:
        args.rows, args.files, args.row_group_size, args.repeats = 100_000, 4, 8192, 1
        args.batch_size = args.batch_size or 1024
        args.positions = args.positions or "0,0.5"
    args.positions = args.positions or ",".join(map(str, POSITIONS))
    args.batch_size = args.batch_size or 4096
    try:
        args.positions = [float(x) for x in args.positions.split(",") if x.strip()]
        args.workers = [int(x) for x in args.workers.split(",") if x.strip()]
    except ValueError as exc:
        p.error(f"--positions takes fractions and --workers integers, comma-separated: {exc}")
    if not all(0 <= x < 1 for x in args.positions) or 0 not in args.positions:
        p.error(f"--positions must be fractions in [0, 1) and include 0 (the fresh start), "
                f"got {args.positions}")
    if args.child:
        args.workers = args.child_workers
    if args.data is None:
        args.data = default_data(args.rows, args.files, args.row_group_size)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        # torch and pqloader imported off the clock, as in a training process that restores
        import pqloader

        print("CHILD " + json.dumps(CHILDREN[args.child](args)), flush=True)
        return 0
    import pqloader

    commit = harness.commit()  # before the runs: others may commit while they go on
    package = Path(pqloader.__file__).parent
    modified = harness.modified(package)
    ensure_data(args.data, args.rows, args.files, args.row_group_size)
    with tempfile.TemporaryDirectory(prefix="pqloader-bench-resume-") as folder:
        states, num_batches = save_states(args, Path(folder))
        configs = list(itertools.product(args.positions, args.workers, KINDS))
        runs: dict[tuple[float, int, str], list[dict[str, Any]]] = {c: [] for c in configs}
        for repeat in range(args.repeats):
            k = repeat * len(configs) // args.repeats  # rotate: no child always goes first
            for p, n, kind in configs[k:] + configs[:k]:
                r = run_child(kind, states[p, n], n, args)
                runs[p, n, kind].append(r)
                note = r.get("error") or f"{r['seconds']:.3f} s (batch {r['batch']})"
                print(f"[{repeat + 1}/{args.repeats}] {kind} p={p:.0%} w{n}: {note}",
                      file=sys.stderr)
    rows = summarise(runs, args)
    print_table(rows, args, num_batches)
    print("RESULT " + json.dumps({
        "benchmark": "resume", "commit": commit, "pqloader": str(package),
        "pqloader_modified": modified, "rows": args.rows, "files": args.files,
        "row_group_size": args.row_group_size, "batch_size": args.batch_size,
        "num_batches": num_batches, "repeats": args.repeats, "results": rows,
    }))
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
