"""The demo: write a synthetic sharded Parquet dataset, train a small MLP on it with pqloader.

Run it with ``bash scripts/demo.sh`` (or ``python examples/demo.py --help``). It prints what was
written, the opened dataset, and per epoch the throughput, the share of the time spent waiting
for data, the loss at the start and at the end, and the accuracy on the last batches.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from torch import nn

import pqloader

NUM_FEATURES = 32
NUM_CLASSES = 10
ROW_GROUP_ROWS = 65_536
LOG_BATCHES = 20  # batches averaged for the loss at the start and end, and for the accuracy
LABEL_NOISE = 0.5  # std of the noise added to the logits that pick the label (their std is ~5.7)
FEATURES = [f"f{j:02d}" for j in range(NUM_FEATURES)]


def synthetic_batches(rows: int, seed: int) -> Iterator[pa.RecordBatch]:
    """``rows`` rows, one row group at a time, from one seeded RNG (never all in memory).

    The label is the argmax of a fixed random linear map of the features plus a little noise:
    a function the model can learn, but not quite perfectly.
    """
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((NUM_FEATURES, NUM_CLASSES)).astype(np.float32)
    for start in range(0, rows, ROW_GROUP_ROWS):
        n = min(ROW_GROUP_ROWS, rows - start)
        # (features, rows): each feature column is contiguous, so Arrow takes it without a copy
        x = rng.standard_normal((NUM_FEATURES, n), dtype=np.float32)
        logits = x.T @ weights + LABEL_NOISE * rng.standard_normal((n, NUM_CLASSES),
                                                                   dtype=np.float32)
        label = logits.argmax(axis=1).astype(np.int64)
        yield pa.RecordBatch.from_arrays([*x, label], names=[*FEATURES, "label"])


def write_synthetic(path: Path, *, rows: int, files: int, seed: int) -> list[str]:
    """Write the synthetic dataset to ``path`` in ``files`` files and report what was written."""
    start = time.perf_counter()
    paths: list[str] = pqloader.write_dataset(
        synthetic_batches(rows, seed), path, rows_per_file=math.ceil(rows / files),
        row_group_size=ROW_GROUP_ROWS, progress=False,
    )
    seconds = time.perf_counter() - start
    mib = sum(os.path.getsize(p) for p in paths) / 2**20
    print(f"wrote {len(paths)} files, {rows:,} rows, {mib:,.1f} MiB on disk in {seconds:.1f} s "
          f"({NUM_FEATURES} float32 features + int64 label, {ROW_GROUP_ROWS:,}-row groups)")
    return paths


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(NUM_FEATURES, 64), nn.ReLU(), nn.Linear(64, NUM_CLASSES))


def train_epoch(model: nn.Module, optimizer: torch.optim.Optimizer,
                loader: pqloader.DataLoader, epoch: int,
                device: torch.device) -> dict[str, float]:
    """One epoch; returns rows, seconds, the waiting share, losses and recent accuracy."""
    loss_fn = nn.CrossEntropyLoss()
    loader.set_epoch(epoch)
    losses: list[float] = []
    recent: list[tuple[int, int]] = []  # (correct, rows) of the last LOG_BATCHES batches
    rows = 0
    waiting_s = 0.0
    model.train()
    start = time.perf_counter()
    batches = iter(loader)
    while True:
        t0 = time.perf_counter()
        batch = next(batches, None)
        waiting_s += time.perf_counter() - t0
        if batch is None:
            break
        # with device="cuda" the batch is already there (a no-op then)
        x = torch.stack([batch[name] for name in FEATURES], dim=1).to(device)
        y = batch["label"].to(device)
        logits = model(x)
        loss = loss_fn(logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        recent.append((int((logits.argmax(dim=1) == y).sum()), len(y)))
        del recent[:-LOG_BATCHES]
        rows += len(y)
    seconds = time.perf_counter() - start
    k = max(1, min(LOG_BATCHES, len(losses) // 4))
    return {
        "rows": rows,
        "batches": len(losses),
        "seconds": seconds,
        "rows_per_s": rows / seconds,
        "waiting_share": waiting_s / seconds,
        "loss_start": float(np.mean(losses[:k])),
        "loss_end": float(np.mean(losses[-k:])),
        "window": k,
        "accuracy": sum(c for c, _ in recent) / sum(n for _, n in recent),
        "accuracy_batches": len(recent),
    }


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Write a synthetic sharded Parquet dataset to a temporary folder, then train "
                    "a small MLP (32 -> 64 -> 10) on it with pqloader.DataLoader, printing "
                    "rows/s, the share of time spent waiting for data, loss and accuracy.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--rows", type=positive_int, default=2_000_000,
                        help="rows to write (the default finishes in well under 2 minutes on "
                             "2 CPU cores; lower it on slower machines)")
    parser.add_argument("--files", type=positive_int, default=16,
                        help="files to write (each holds ceil(rows / files) rows)")
    parser.add_argument("--batch-size", type=positive_int, default=4096, help="rows per batch")
    parser.add_argument("--num-workers", type=int, default=2,
                        help="loader worker threads (0: make batches in the training loop)")
    parser.add_argument("--epochs", type=positive_int, default=1, help="epochs to train")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the data, the model and the loader's shuffle")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="where the model trains (auto: cuda when a CUDA device is there; "
                             "the loader's threads then copy the batches to it)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device")
    if args.files > args.rows:
        parser.error(f"--files {args.files} is more than --rows {args.rows}")
    if args.num_workers < 0:
        parser.error(f"--num-workers must be at least 0, got {args.num_workers}")
    if args.seed < 0:
        parser.error(f"--seed must be at least 0, got {args.seed}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    torch.manual_seed(args.seed)
    # The model is tiny: one thread runs a step in a few ms, while more intra-op threads fight
    # the loader's workers for the cores (5x slower epochs on 2 cores when left at the default).
    torch.set_num_threads(1)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    with tempfile.TemporaryDirectory(prefix="pqloader-demo-") as tmp:
        path = Path(tmp) / "train"
        write_synthetic(path, rows=args.rows, files=args.files, seed=args.seed)
        ds = pqloader.ParquetDataset(path)
        print(ds)
        loader = pqloader.DataLoader(ds, batch_size=args.batch_size, shuffle=True,
                                     seed=args.seed, num_workers=args.num_workers,
                                     device=device)
        model = make_model().to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        print(f"training a 32 -> 64 -> 10 MLP: {len(loader)} batches of {args.batch_size:,} "
              f"rows per epoch, {args.num_workers} loader worker threads, 1 torch thread, "
              f"on {device}, {args.epochs} epoch(s)")
        first: dict[str, float] = {}
        stats: dict[str, float] = {}
        for epoch in range(args.epochs):
            stats = train_epoch(model, optimizer, loader, epoch, device)
            first = first or stats
            print(f"epoch {epoch}: {stats['rows']:,} rows in {stats['seconds']:.1f} s = "
                  f"{stats['rows_per_s']:,.0f} rows/s; waiting for data "
                  f"{stats['waiting_share']:.1%} of the time; loss {stats['loss_start']:.3f} "
                  f"(first {stats['window']} batches) -> {stats['loss_end']:.3f} (last "
                  f"{stats['window']}); accuracy {stats['accuracy']:.1%} (last "
                  f"{stats['accuracy_batches']} batches)")
            if stats["rows"] != len(ds):
                print(f"error: epoch {epoch} delivered {stats['rows']:,} rows, the dataset has "
                      f"{len(ds):,}; every row should come exactly once", file=sys.stderr)
                return 1
    print(f"done in {time.perf_counter() - started:.1f} s: {args.epochs} epoch(s) of "
          f"{args.rows:,} rows, last epoch {stats['rows_per_s']:,.0f} rows/s, waiting for data "
          f"{stats['waiting_share']:.1%}, loss {first['loss_start']:.3f} -> "
          f"{stats['loss_end']:.3f}, accuracy {stats['accuracy']:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
