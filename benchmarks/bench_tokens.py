"""How fast does pqloader deliver shuffled, padded batches of token lists (W2 of issue 4), against
the pyarrow decode + numpy padding floor and the naive tutorial way (pandas in memory + a
map-style Dataset + torch's DataLoader with a ``pad_sequence`` collate_fn)?

    .venv/bin/python benchmarks/bench_tokens.py            # 1M rows of list<int32>, 32-512 long
    .venv/bin/python benchmarks/bench_tokens.py --tiny     # seconds: the smoke test's run
    .venv/bin/python benchmarks/bench_tokens.py --peers    # + every peer (opt-in: see below)

The metric is real (non-padding) tokens per second: batches of 64 rows are padded to the batch's
longest row and come with a mask, which every method builds (the floor and pqloader inside the
timed loop, the naive way in its collate_fn). Each method runs in a fresh child process (this
script with ``--child METHOD``); the parent samples the memory of the child's process tree (the
child and its workers) every 20 ms. Methods are interleaved across repeats so that the machine's
noise hits them all alike; the table shows medians and ratios, then one ``RESULT {json}`` line
holds every number.

Checks: the floor and pqloader must deliver every real token of the dataset (the generator's
count) and agree on the sum of all token ids and labels; every method sums its batch's tokens in
its timed loop for this (one pass over the batch, as a copy to the GPU would be). The naive way
is timed over its first ``--naive-batches`` batches only (it is slow): naive-w0 and naive-w2
must agree with each other (the same seeded sampler), and their masks with their lengths.

Peers (opt-in: ``--peers`` adds them all, ``--methods`` picks some): hf-map, hf-map-batched and
hf-stream (Hugging Face ``datasets``), petastorm, mosaic (MosaicML Streaming over MDS), ray
(Ray Data) and lance, each padding with its documented way (a ``pad_sequence`` collate_fn for
per-sample loaders, numpy from Arrow offsets where batches are Arrow). Each runs in its own venv
under ``.venv-peers/``, which the first run makes (pip, minutes); conversions (MDS, Lance, the
``datasets`` cache) are made once beside the data, timed, and reused. A peer is timed after its
first batch for up to ``--peer-seconds``, with pqloader's consumer; when it delivers a whole
epoch, its token and label sums must match the floor's.
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
from bench_tabular import PEER_METHODS, SEED, peer_note

METHODS = ("floor", "naive-w0", "naive-w2", "pqloader-w0", "pqloader-w2")
MIN_TOKENS, MAX_TOKENS = 32, 512  # row lengths, uniform, both ends included
VOCAB = 50_000  # token ids in [1, VOCAB): 0 is the padding


# -- data -------------------------------------------------------------------------------------
def _lengths(rows: int, row_group_size: int) -> Any:
    """Each chunk's row lengths, from their own seeded stream: the parent can count the
    dataset's tokens without generating (or reading) the tokens themselves."""
    rng = np.random.default_rng([SEED, 0])
    for start in range(0, rows, row_group_size):
        n = min(row_group_size, rows - start)
        yield rng.integers(MIN_TOKENS, MAX_TOKENS + 1, n, dtype=np.int32)


def _batches(rows: int, row_group_size: int) -> Any:
    """Seeded record batches of ``row_group_size`` rows: never the whole dataset in memory."""
    rng = np.random.default_rng([SEED, 1])
    for lengths in _lengths(rows, row_group_size):
        offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        tokens = rng.integers(1, VOCAB, int(offsets[-1]), dtype=np.int32)
        label = rng.integers(0, 10, len(lengths), dtype=np.int64)
        yield pa.RecordBatch.from_arrays(
            [pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens)), pa.array(label)],
            names=["tokens", "label"])


def expected_tokens(rows: int, row_group_size: int) -> int:
    """The dataset's real tokens, counted from the generator's lengths alone."""
    return sum(int(lengths.sum(dtype=np.int64)) for lengths in _lengths(rows, row_group_size))


def ensure_data(path: Path, rows: int, files: int, row_group_size: int) -> None:
    """Write the dataset into ``path`` unless it already holds it (same rows, files, groups)."""
    rows_per_file = -(-rows // files)
    parts = sorted(path.glob("part-*.parquet"))
    finished = not (path / "_pqloader_incomplete").exists()  # a write killed: written again
    if finished and len(parts) == -(-rows // rows_per_file):
        metas = [pq.read_metadata(p) for p in parts]
        if sum(m.num_rows for m in metas) == rows and \
                metas[0].row_group(0).num_rows == min(row_group_size, rows_per_file):
            print(f"reusing {path}", file=sys.stderr)
            return
    import pqloader

    print(f"writing {rows:,} rows into {path} ...", file=sys.stderr)
    t0 = time.perf_counter()
    pqloader.write_dataset(_batches(rows, row_group_size), path, rows_per_file=rows_per_file,
                           row_group_size=row_group_size, overwrite=True)
    print(f"  written in {time.perf_counter() - t0:.0f} s", file=sys.stderr)


# -- the methods, each run in a child process -------------------------------------------------
def run_floor(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The floor: every row group decoded by pyarrow, in file order, no shuffle; each 64-row
    slice padded with numpy straight from the list offsets (no per-row Python), with a mask."""
    t0 = time.perf_counter()
    tokens = padded = token_sum = label_sum = batches = 0
    for file in sorted(path.glob("*.parquet")):
        pf = pq.ParquetFile(file)
        for i in range(pf.num_row_groups):
            table = pf.read_row_group(i, use_threads=True)
            lists = table.column("tokens").combine_chunks()
            offsets = lists.offsets.to_numpy()  # absolute positions in lists.values
            values = lists.values.to_numpy()
            labels = table.column("label").to_numpy()
            for start in range(0, len(lists), args.batch_size):
                off = offsets[start:start + args.batch_size + 1]
                lengths = np.diff(off)
                mask = np.arange(lengths.max()) < lengths[:, None]
                batch = np.zeros(mask.shape, dtype=values.dtype)
                batch[mask] = values[off[0]:off[-1]]
                tokens += int(lengths.sum())
                padded += batch.size
                token_sum += int(batch.sum(dtype=np.int64))
                label_sum += int(labels[start:start + args.batch_size].sum())
                batches += 1
    return {"tokens": tokens, "seconds": time.perf_counter() - t0, "padded": padded,
            "batches": batches, "token_sum": token_sum, "label_sum": label_sum}


class TutorialDataset:
    """The tutorial way: a map-style dataset over a DataFrame, one ``df.iloc[i]`` per row."""

    def __init__(self, df: Any) -> None:
        self.df = df

    def __len__(self) -> int:
        return len(self.df)

    def __getitem__(self, i: int) -> Any:
        import torch  # imported here so that the floor's child never loads torch

        row = self.df.iloc[i]
        return torch.tensor(row["tokens"]), int(row["label"])


def pad_collate(samples: list[Any]) -> Any:
    """The tutorial collate_fn: ``pad_sequence`` to the batch's longest row, lengths, a mask."""
    import torch
    from torch.nn.utils.rnn import pad_sequence

    rows, labels = zip(*samples, strict=True)
    tokens = pad_sequence(rows, batch_first=True, padding_value=0)
    lengths = torch.tensor([len(r) for r in rows])
    mask = torch.arange(tokens.shape[1]) < lengths[:, None]
    return tokens, lengths, mask, torch.tensor(labels)


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
                                         shuffle=True, num_workers=num_workers,
                                         collate_fn=pad_collate)
    batches = iter(loader)
    next(batches)
    tokens = padded = token_sum = masked = n = 0
    t0 = time.perf_counter()
    for batch, lengths, mask, _labels in itertools.islice(batches, args.naive_batches):
        tokens += int(lengths.sum())
        padded += batch.numel()
        token_sum += int(batch.sum(dtype=torch.int64))
        masked += int(mask.sum())
        n += 1
    seconds = time.perf_counter() - t0
    if masked != tokens:
        sys.exit(f"the masks hold {masked:,} tokens; the lengths say {tokens:,}")
    return {"tokens": tokens, "seconds": seconds, "padded": padded, "batches": n,
            "token_sum": token_sum, "load_s": load_s}


def consume(batch: dict[str, Any]) -> dict[str, int]:
    """What pqloader's and the peers' consumer does with a batch: the mask, and the sums."""
    import torch

    lengths = batch["tokens_lengths"]
    mask = torch.arange(batch["tokens"].shape[1]) < lengths[:, None]
    return {"tokens": int(lengths.sum()), "padded": mask.numel(),
            "token_sum": int(batch["tokens"].sum(dtype=torch.int64)),
            "label_sum": int(batch["label"].sum()), "batches": 1}


def run_pqloader(path: Path, args: argparse.Namespace, num_workers: int) -> dict[str, Any]:
    """pqloader's DataLoader, shuffled, every batch consumed; the dataset's opening is timed."""
    import torch  # noqa: F401  (a once-per-process cost, as before: pqloader imports it lazily)

    import pqloader

    t0 = time.perf_counter()
    ds = pqloader.ParquetDataset(path)
    loader = pqloader.DataLoader(ds, batch_size=args.batch_size, shuffle=True, seed=SEED,
                                 num_workers=num_workers)
    totals = dict.fromkeys(("tokens", "padded", "token_sum", "label_sum", "batches"), 0)
    for batch in loader:
        for k, v in consume(batch).items():
            totals[k] += v
    return {**totals, "seconds": time.perf_counter() - t0}


def run_peer(path: Path, args: argparse.Namespace, method: str) -> dict[str, Any]:
    """A peer's loader (peer_loaders.py): real tokens/s after its first batch, for up to
    ``--peer-seconds``; the epoch's counts and sums only when it delivered the whole epoch."""
    w = peer_loaders.Workload(data=path, out=path.parent / f"{path.name}-peers",
                              batch_size=args.batch_size, list_column="tokens", seed=SEED)
    if args.prepare:
        return peer_loaders.prepare(method, w)
    r = peer_loaders.measure(method, w, consume, args.peer_seconds)
    out = {k: r[f"timed_{k}"] for k in ("tokens", "padded", "batches")}
    out.update(seconds=r["seconds"], first_batch_s=r["first_batch_s"],
               whole_epoch=r["whole_epoch"])
    if r["whole_epoch"]:
        out.update({f"epoch_{k}": r[k] + r[f"timed_{k}"]
                    for k in ("tokens", "token_sum", "label_sum")})
    return out


CHILDREN = {
    "floor": run_floor,
    "naive-w0": lambda p, a: run_naive(p, a, 0),
    "naive-w2": lambda p, a: run_naive(p, a, 2),
    "pqloader-w0": lambda p, a: run_pqloader(p, a, 0),
    "pqloader-w2": lambda p, a: run_pqloader(p, a, 2),
    **{m: functools.partial(run_peer, method=m) for m in PEER_METHODS},
}


# -- the parent: run, watch, summarise --------------------------------------------------------
def child_argv(path: Path, args: argparse.Namespace) -> list[str]:
    return ["--data", str(path), "--batch-size", str(args.batch_size),
            "--naive-batches", str(args.naive_batches), "--peer-seconds", str(args.peer_seconds)]


def run_child(method: str, path: Path, args: argparse.Namespace,
              prepared: dict[str, dict[str, Any]]) -> dict[str, Any]:
    if "error" in prepared.get(method, {}):
        return {"error": prepared[method]["error"]}
    python = prepared[method]["python"] if method in prepared else sys.executable
    result = harness.run_child(__file__, method, child_argv(path, args), python=python)
    if "error" not in result:
        result.update(tokens_per_s=result["tokens"] / max(result["seconds"], 1e-9),
                      fill=result["tokens"] / max(result["padded"], 1))
    return result


def summarise(runs: dict[str, list[dict[str, Any]]], total: dict[str, int],
              prepared: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per method: median tokens/s and peak memory over the runs, ratios, failures; for the
    peers, their conversion and pqloader's ratio to the best `datasets` mode.

    ``total``: the dataset's rows and real tokens; the floor and pqloader must deliver them all,
    and so must a peer in a run that reached the end of the epoch.
    """
    out: dict[str, Any] = {}
    for method, results in runs.items():
        ok = [r for r in results if "error" not in r]
        errors = [r["error"] for r in results if "error" in r]
        s: dict[str, Any] = {"runs": results, "errors": errors}
        if method in prepared:
            s["convert_s"] = prepared[method].get("convert_s")
        if ok:
            s.update(tokens_per_s=statistics.median(r["tokens_per_s"] for r in ok),
                     fill=statistics.median(r["fill"] for r in ok),
                     peak_rss_mib=round(statistics.median(r["peak_rss_mib"] for r in ok)),
                     peak_pss_mib=round(statistics.median(r["peak_pss_mib"] for r in ok)),
                     peak_rss_mib_max=max(r["peak_rss_mib"] for r in ok))
            if method.startswith("naive"):
                s["load_s"] = statistics.median(r["load_s"] for r in ok)
            elif method in PEER_METHODS:
                s["first_batch_s"] = statistics.median(r["first_batch_s"] for r in ok)
                if bad := [r["epoch_tokens"] for r in ok if r["whole_epoch"] and
                           r["epoch_tokens"] != total["tokens"]]:
                    errors.append(f"delivered {bad} real tokens in an epoch, expected "
                                  f"{total['tokens']}")
            elif any(r["tokens"] != total["tokens"] for r in ok):
                errors.append(f"delivered {[r['tokens'] for r in ok]} real tokens, expected "
                              f"{total['tokens']}")
        out[method] = s
    floor = out.get("floor", {}).get("tokens_per_s")
    naive = [s["tokens_per_s"] for m, s in out.items()
             if m.startswith("naive") and "tokens_per_s" in s]
    # Methods that see the same rows must agree on every sum: the floor and pqloader (whole
    # epochs), and the naive ones among themselves (the same seeded sampler, the same batches).
    # A peer's whole-epoch runs join the floor's group with their epoch_* sums.
    for naive_group in (False, True):
        group = {m: s for m, s in out.items() if m.startswith("naive") == naive_group}
        for key in ("tokens", "token_sum", "label_sum"):
            sums = {r[key] for m, s in group.items() for r in s["runs"]
                    if key in r and m not in PEER_METHODS}
            sums |= {r[f"epoch_{key}"] for m, s in group.items() for r in s["runs"]
                     if f"epoch_{key}" in r and not naive_group}
            if len(sums) > 1:
                for s in group.values():
                    s["errors"].append(f"{key} differs between methods: {sorted(sums)}")
    floor_runs = [out["floor"]["runs"]] if floor else []
    for s in out.values():
        if "tokens_per_s" in s:
            s["x_floor"] = s["tokens_per_s"] / floor if floor else None
            s["x_floor_paired"] = harness.paired(s["runs"], floor_runs, "tokens_per_s")
            s["x_best_naive"] = s["tokens_per_s"] / max(naive) if naive else None
    hf = {m: s["tokens_per_s"] for m, s in out.items()
          if m.startswith("hf-") and "tokens_per_s" in s}
    if hf:
        best = max(hf, key=hf.__getitem__)
        for s in out.values():
            if "tokens_per_s" in s:
                s["x_best_hf"], s["best_hf"] = s["tokens_per_s"] / hf[best], best
    return out


def print_table(summary: dict[str, Any], args: argparse.Namespace) -> None:
    def ratio(x: float | None) -> str:  # small ratios keep two significant digits
        if x is None:
            return "-"
        return f"{x:,.0f}" if x >= 100 else f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"

    print(f"\npadded token batches: {args.rows:,} rows of list<int32>, {MIN_TOKENS}-{MAX_TOKENS} "
          f"tokens, + int64 label, {args.files} files, {args.row_group_size:,}-row groups, batch "
          f"{args.batch_size} padded to its longest row + mask; median of {args.repeats}")
    hf = any("x_best_hf" in s for s in summary.values())
    print(f"{'method':<16}{'real tokens/s':>15}{'x floor':>9}{'paired':>8}{'x naive':>9}"
          + (f"{'x hf':>9}" if hf else "") + f"{'fill':>6}{'peak RSS MiB':>14}{'peak PSS MiB':>14}")
    for method, s in summary.items():
        if "tokens_per_s" not in s:
            print(f"{method:<16}  FAILED: {s['errors'][0]}")
            continue
        star = "*" if method.startswith("naive") else "+" if method in PEER_METHODS else ""
        print(f"{method + star:<16}{s['tokens_per_s']:>15,.0f}{ratio(s['x_floor']):>9}"
              f"{ratio(s['x_floor_paired']):>8}{ratio(s['x_best_naive']):>9}"
              + (f"{ratio(s['x_best_hf']):>9}" if hf else "")
              + f"{s['fill']:>6.2f}{s['peak_rss_mib']:>14,}{s['peak_pss_mib']:>14,}")
    if any(m.startswith("naive") for m in summary):
        loads = ", ".join(f"{m} {s['load_s']:.1f} s" for m, s in summary.items() if "load_s" in s)
        print(f"* naive: tokens/s over {args.naive_batches} batches after the first; the load "
              f"(pd.read_parquet) and the first batch are not counted ({loads})")
    if peers := [m for m in summary if m in PEER_METHODS]:
        print(peer_note(summary, peers, args.peer_seconds, "real tokens"))
    print("floor: pyarrow decode + numpy padding, no shuffle; paired: the median over rounds of "
          "the ratio to the floor of the same round; pqloader: shuffled, every row, timed "
          "from opening the dataset. fill: real tokens / padded batch elements. Peak memory of "
          "the process tree, median of the runs' peaks: RSS counts shared pages once per "
          "process, PSS splits them.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="runs per method; medians reported")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated, among "
                   + ", ".join(METHODS + PEER_METHODS) + " (default: the first 5)")
    p.add_argument("--peers", action="store_true", help="add every peer: "
                   + ", ".join(PEER_METHODS) + "; each runs in its own venv under "
                   ".venv-peers/, which the first run makes with pip (minutes)")
    p.add_argument("--peer-seconds", type=float, default=30,
                   help="time each peer for at most this long after its first batch")
    p.add_argument("--data", type=Path, help="dataset folder, reused when it holds the same "
                   "rows, files and row groups (default: one under the temp dir)")
    p.add_argument("--tiny", action="store_true",
                   help="20k rows, 4 files, 2048-row groups, 1 repeat: a smoke run")
    p.add_argument("--naive-batches", type=int, default=200, help=argparse.SUPPRESS)
    p.add_argument("--child", choices=METHODS + PEER_METHODS, help=argparse.SUPPRESS)
    p.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.row_group_size = 8192
    if args.tiny:
        args.rows, args.files, args.row_group_size, args.repeats = 20_000, 4, 2048, 1
        args.naive_batches = min(args.naive_batches, 5)
        args.peer_seconds = min(args.peer_seconds, 5)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if args.peers:
        args.methods += [m for m in PEER_METHODS if m not in args.methods]
    if unknown := sorted(set(args.methods) - set(METHODS + PEER_METHODS)):
        p.error(f"unknown methods {unknown}; choose among {', '.join(METHODS + PEER_METHODS)}")
    if args.data is None:
        args.data = Path(tempfile.gettempdir()) / (
            f"pqloader-bench-tokens-{args.rows}x{args.files}-{args.row_group_size}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print("CHILD " + json.dumps(CHILDREN[args.child](args.data, args)), flush=True)
        return 0
    import peers  # the parent's only: it makes the peers' venvs
    commit = harness.commit()  # before the runs: others may commit while they go on
    ensure_data(args.data, args.rows, args.files, args.row_group_size)
    total = {"rows": args.rows, "tokens": expected_tokens(args.rows, args.row_group_size)}
    prepared = peers.prepare(__file__, [m for m in args.methods if m in PEER_METHODS],
                             child_argv(args.data, args), peer_loaders.METHODS)
    runs = harness.interleave(args.methods, args.repeats,
                              lambda m: run_child(m, args.data, args, prepared),
                              lambda r: f"{r['tokens_per_s']:,.0f} tokens/s")
    summary = summarise(runs, total, prepared)
    print_table(summary, args)
    print("RESULT " + json.dumps({
        "benchmark": "tokens", "commit": commit, "rows": args.rows, "files": args.files,
        "row_group_size": args.row_group_size, "batch_size": args.batch_size,
        "total_tokens": total["tokens"], "repeats": args.repeats,
        "naive_batches": args.naive_batches, "methods": summary,
    }))
    return 1 if any(s["errors"] for s in summary.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
