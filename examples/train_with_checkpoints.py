"""Training that survives being killed: checkpoints hold the loader's cursor, so a restart
continues the epoch batch for batch instead of starting it over.

Run it, kill it (Ctrl-C, ``kill -9``, a pre-empted node), run it again with the same arguments:

    python examples/train_with_checkpoints.py --data /tmp/ckpt-demo/data \\
        --checkpoint /tmp/ckpt-demo/ckpt.pt --delivered-log /tmp/ckpt-demo/delivered.jsonl

Every ``--checkpoint-every`` steps it saves ``{"model", "optimizer", "loader", "step"}`` with
``torch.save``, atomically (a temp file, then ``os.replace``), so a kill leaves the previous
checkpoint or the new one, never half of one. On start it restores all four and goes on from
``loader.epoch``. For auditing, every batch's ids are appended to ``--delivered-log`` as one
JSON line, written and fsynced *before* the optimizer step: the batches after the checkpoint's
step are the ones a restart trains on again, and the log shows that they come back identical.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch import nn

import pqloader

NUM_FEATURES = 16
NUM_CLASSES = 4
FEATURES = [f"f{j:02d}" for j in range(NUM_FEATURES)]
CHUNK_ROWS = 8192  # rows per generated RecordBatch (the writer streams them)
DATA_SEED = 0


# -- the dataset ----------------------------------------------------------------------------
def synthetic_batches(rows: int, seed: int = DATA_SEED) -> Iterator[pa.RecordBatch]:
    """``id`` 0..rows-1, 16 float32 features and an int64 label, one chunk at a time.

    The label is the argmax of a fixed random linear map of the features: learnable.
    """
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((NUM_FEATURES, NUM_CLASSES)).astype(np.float32)
    for start in range(0, rows, CHUNK_ROWS):
        n = min(CHUNK_ROWS, rows - start)
        x = rng.standard_normal((NUM_FEATURES, n), dtype=np.float32)  # a row per feature
        label = (x.T @ weights).argmax(axis=1).astype(np.int64)
        ids = np.arange(start, start + n, dtype=np.int64)
        yield pa.RecordBatch.from_arrays([ids, *x, label], names=["id", *FEATURES, "label"])


def ensure_dataset(path: Path, *, rows: int, files: int) -> pqloader.ParquetDataset:
    """Open the dataset at ``path``, writing it first if absent.

    It is written into a temporary sibling folder that is renamed into place once complete, so
    a run killed while writing leaves no half dataset to be reused by the next one.
    """
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
        try:
            start = time.perf_counter()
            row_group_rows = min(CHUNK_ROWS, math.ceil(rows / files))
            pqloader.write_dataset(synthetic_batches(rows), tmp,
                                   rows_per_file=math.ceil(rows / files),
                                   row_group_size=row_group_rows, progress=False)
            os.chmod(tmp, 0o755)  # mkdtemp makes it private
            os.replace(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"wrote {rows:,} rows in {files} files to {path} "
              f"in {time.perf_counter() - start:.1f} s", flush=True)
    ds = pqloader.ParquetDataset(path)
    if len(ds) != rows:
        raise SystemExit(f"error: {path} holds {len(ds):,} rows, --rows is {rows:,}; pass "
                         "the --rows it was written with, or another --data folder")
    print(f"using {ds}", flush=True)
    return ds


# -- checkpoints and the delivered log ------------------------------------------------------
def save_checkpoint(path: Path, checkpoint: dict[str, Any]) -> None:
    """``torch.save`` to a temp file in the same folder, fsync, then ``os.replace``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    # make the rename itself durable (a power cut, not only a kill)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class DeliveredLog:
    """Appends one JSON line per event; each line written whole and fsynced.

    A kill loses at most the line being written; a torn last line left by one is cut off when
    the log is opened again, so the next run's lines start on a line of their own.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        size = os.fstat(self._fd).st_size
        if size:
            with open(path, "rb") as f:
                data = f.read()
            keep = data.rfind(b"\n") + 1
            if keep != size:
                os.ftruncate(self._fd, keep)
                print(f"{path}: cut a torn last line ({size - keep} bytes) left by a killed run",
                      flush=True)

    def write(self, record: dict[str, Any]) -> None:
        os.write(self._fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


# -- training -------------------------------------------------------------------------------
def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(NUM_FEATURES, 64), nn.ReLU(), nn.Linear(64, NUM_CLASSES))


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train a small MLP with pqloader.DataLoader, checkpointing model, "
                    "optimizer and loader cursor; a restart continues mid-epoch exactly.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--data", type=Path, required=True,
                        help="dataset folder: written there if absent, reused otherwise")
    parser.add_argument("--rows", type=positive_int, default=200_000, help="rows in the dataset")
    parser.add_argument("--files", type=positive_int, default=8, help="files to write")
    parser.add_argument("--batch-size", type=positive_int, default=1024, help="rows per batch")
    parser.add_argument("--epochs", type=positive_int, default=1, help="epochs to train")
    parser.add_argument("--num-workers", type=int, default=2,
                        help="loader workers; restoring a checkpoint saved with another number "
                             "continues the epoch with the rows not yet delivered, in a new order")
    parser.add_argument("--worker-type", choices=["thread", "process"], default="thread",
                        help="loader worker threads or torch worker processes")
    parser.add_argument("--checkpoint-every", type=positive_int, default=20,
                        help="steps between checkpoints")
    parser.add_argument("--checkpoint", type=Path, required=True,
                        help="checkpoint file: restored from if present, replaced atomically")
    parser.add_argument("--delivered-log", type=Path, required=True,
                        help="appended: one JSON line per batch trained on (step, epoch, ids)")
    parser.add_argument("--audit-dir", type=Path, default=None,
                        help="record every batch's rows there (check with: pqloader audit DIR)")
    parser.add_argument("--sleep-per-step", type=float, default=0.0, metavar="S",
                        help="seconds to sleep per step (lets a test kill it mid-epoch)")
    args = parser.parse_args(argv)
    if args.files > args.rows:
        parser.error(f"--files {args.files} is more than --rows {args.rows}")
    if args.num_workers < 0:
        parser.error(f"--num-workers must be at least 0, got {args.num_workers}")
    if args.sleep_per_step < 0:
        parser.error(f"--sleep-per-step must be at least 0, got {args.sleep_per_step}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)  # a tiny model: more intra-op threads only fight the loader
    ds = ensure_dataset(args.data, rows=args.rows, files=args.files)
    loader = pqloader.DataLoader(ds, batch_size=args.batch_size, shuffle=True, seed=0,
                                 num_workers=args.num_workers, worker_type=args.worker_type,
                                 audit_dir=args.audit_dir)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = 0
    if args.checkpoint.exists():
        ckpt = torch.load(args.checkpoint, weights_only=True)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])
        step = int(ckpt["step"])
        print(f"resumed from {args.checkpoint}: step {step}, epoch {loader.epoch}, "
              f"{ckpt['loader']['batches']}/{len(loader)} batches of it done", flush=True)
    else:
        args.checkpoint.parent.mkdir(parents=True, exist_ok=True)
    print(f"training: {len(loader)} batches of {args.batch_size:,} rows per epoch, "
          f"{args.epochs} epoch(s), {args.num_workers} {args.worker_type} workers, "
          f"checkpoint every {args.checkpoint_every} steps", flush=True)

    log = DeliveredLog(args.delivered_log)
    log.write({"event": "start", "pid": os.getpid(), "step": step})
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    started = time.perf_counter()
    saved_step = step

    def checkpoint(why: str) -> None:
        nonlocal saved_step
        save_checkpoint(args.checkpoint, {
            "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "loader": loader.state_dict(), "step": step,
        })
        saved_step = step
        print(f"step {step}: epoch {epoch} batch {position}, loss {loss.item():.3f}, "
              f"checkpoint saved ({why})", flush=True)

    try:
        for epoch in range(loader.epoch, args.epochs):
            loader.set_epoch(epoch)  # the restored epoch keeps its cursor
            # batches of this epoch's plan already yielded: 0, or where the checkpoint left it
            position = loader.state_dict()["batches"]
            for batch in loader:
                step += 1
                position += 1
                # Logged before the step changes the model: a batch in the log after the
                # checkpoint's step may or may not have been trained on, and will be again.
                log.write({"step": step, "epoch": epoch, "batch": position,
                           "ids": batch["id"].tolist()})
                x = torch.stack([batch[name] for name in FEATURES], dim=1)
                loss = loss_fn(model(x), batch["label"])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                if args.sleep_per_step:
                    time.sleep(args.sleep_per_step)
                if step % args.checkpoint_every == 0:
                    checkpoint(f"every {args.checkpoint_every} steps")
            if saved_step != step:
                checkpoint(f"end of epoch {epoch}")  # a restart then starts the next epoch
    finally:
        log.close()
    print(f"done: step {step}, {args.epochs} epoch(s), this run took "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
