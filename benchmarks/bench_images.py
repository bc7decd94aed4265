"""How fast does pqloader deliver shuffled, augmented image batches (W3 of issue 4), against the
JPEG decode floor on all cores and the naive tutorial way (pandas in memory + a map-style
Dataset decoding one image per ``__getitem__`` + torch's DataLoader)?

    .venv/bin/python benchmarks/bench_images.py            # 200k rows of 64x64 RGB JPEG + label
    .venv/bin/python benchmarks/bench_images.py --tiny     # seconds: the smoke test's run

Every method but the floor decodes each JPEG, flips it horizontally with probability 1/2 and
crops a random 56x56 window, and delivers batches of 256 as a uint8 ``Tensor[B, 3, 56, 56]`` with
an int64 label tensor. The metric is images per second. All methods decode with ``simplejpeg``
(libjpeg-turbo; it releases the GIL while it decodes).

- floor-threads / floor-procs: the decode loop alone on 2 threads / 2 processes: every JPEG of
  the dataset decoded to uint8 arrays, row groups in file order, no shuffle, no augmentation.
  The faster of the two is the floor of the ``x floor`` column.
- naive-w0 / naive-w2: the tutorial way, timed over ``--naive-batches`` batches after the first.
- pqloader-w0 / -w2 / -auto / -w2-proc: ``pqloader.DataLoader(shuffle=True,
  transform=FlipCrop(...))`` with 0 workers, 2 worker threads, ``num_workers="auto"`` and 2
  worker processes; a whole epoch, timed from opening the dataset. The transform receives the
  batch dict (the image column as ``list[bytes]``) and a seeded numpy Generator.
- pqloader-w2-decode (only when named in ``--methods``): pqloader-w2 with a transform that
  decodes alone, as the floor does: the gap to the floor without the augmentation.

Each method runs in a fresh child process (this script with ``--child METHOD``); the parent
samples the memory of the child's process tree every 20 ms. Methods are interleaved across
repeats; the table shows medians and ratios, then one ``RESULT {json}`` line holds every number.
Checks: the floors and pqloader deliver every row once (the same count and label sum); each
batch is uint8 ``[B, 3, 56, 56]``; pqloader's thread and process workers, which make the same
batches with the same seeds, agree on a checksum of every image's corner pixel; so do 0 workers
and "auto" (one stream, the same batches).
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

METHODS = ("floor-threads", "floor-procs", "naive-w0", "naive-w2", "pqloader-w0", "pqloader-w2",
           "pqloader-auto", "pqloader-w2-proc")
# A diagnostic, run only when named in --methods: pqloader-w2 with a transform that decodes alone
# (no flip, no crop, NHWC batch), to split pqloader's gap into loading and augmenting.
EXTRA_METHODS = ("pqloader-w2-decode",)
SEED = 0
SIZE, CROP = 64, 56  # stored images are SIZE x SIZE RGB; every method crops CROP x CROP
QUALITY = 90
NUM_CLASSES = 100
CORES = 2  # the floor's threads or processes: every core of the benchmark machine


def _decoder() -> Any:
    try:
        import simplejpeg
    except ImportError as exc:
        raise ImportError("bench_images needs simplejpeg: pip install 'pqloader[bench]'") from exc
    return simplejpeg


# -- data -------------------------------------------------------------------------------------
def _images(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` seeded RGB images: a two-colour linear gradient, three soft-edged ellipses and
    mild Gaussian noise (sigma 6): JPEG sizes and decode costs of natural thumbnails (~1.9 KB at
    quality 90), unlike pure noise (incompressible) or flat colour (trivial)."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) / (SIZE - 1)
    angle = rng.uniform(0, 2 * np.pi, (n, 1, 1)).astype(np.float32)
    t = np.cos(angle) * (xx - 0.5) + np.sin(angle) * (yy - 0.5) + 0.5
    c0, c1 = rng.uniform(0, 255, (2, n, 1, 1, 3)).astype(np.float32)
    img = c0 + (c1 - c0) * t[..., None]
    for _ in range(3):
        cx, cy = rng.uniform(0, 1, (2, n, 1, 1)).astype(np.float32)
        rx, ry = rng.uniform(0.08, 0.35, (2, n, 1, 1)).astype(np.float32)
        inside = np.square((xx - cx) / rx) + np.square((yy - cy) / ry)
        alpha = np.clip(4 - 4 * inside, 0, 1)[..., None]  # 1 inside, a soft edge, 0 outside
        img += alpha * (rng.uniform(0, 255, (n, 1, 1, 3)).astype(np.float32) - img)
    img += rng.standard_normal(img.shape, dtype=np.float32) * 6
    return np.clip(img, 0, 255, out=img).astype(np.uint8)


def _batches(rows: int, row_group_size: int) -> Iterator[pa.RecordBatch]:
    """Seeded record batches of JPEG bytes + label: never the whole dataset in memory."""
    encode = _decoder().encode_jpeg
    rng = np.random.default_rng([SEED, 3])
    for start in range(0, rows, row_group_size):
        n = min(row_group_size, rows - start)
        jpegs = [encode(a, quality=QUALITY, colorsubsampling="420") for a in _images(rng, n)]
        label = rng.integers(0, NUM_CLASSES, n, dtype=np.int64)
        yield pa.RecordBatch.from_arrays([pa.array(jpegs, pa.binary()), pa.array(label)],
                                         names=["image", "label"])


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


# -- the augmentation, fast --------------------------------------------------------------------
_SPAN = SIZE - CROP + 1  # crop offsets 0..SIZE-CROP on each axis
_local = threading.local()


def _scratch() -> tuple[np.ndarray, list[np.ndarray]]:
    """This thread's decode buffer and, for every crop offset (y, x), the view of it to copy out."""
    if not hasattr(_local, "views"):
        buf = np.empty((SIZE, SIZE * 3), np.uint8)
        _local.buf = buf
        _local.views = [buf[y:y + CROP, 3 * x:3 * (x + CROP)]
                        for y in range(_SPAN) for x in range(_SPAN)]
    return _local.buf, _local.views


def _flip_rows(out: np.ndarray, which: np.ndarray) -> None:
    """Reverse the bytes of every row of the images ``which`` of ``out`` ``[B, H, W * 3]``, in
    place: for an image decoded as BGR that reverses its pixels and makes it RGB again.

    Rows are reversed as 64-bit words, each byte-swapped: a few batch-wide numpy calls instead
    of a byte-by-byte strided copy per image (2.2 us less per flipped image, measured).
    """
    if out.shape[2] % 8:  # rows not a whole number of words: the plain byte reversal
        out[which] = out[which, :, ::-1]
        return
    words = out.view(np.uint64)
    words[which] = words[which, :, ::-1].byteswap()


class FlipCrop:
    """``transform(batch, rng)``: decode the JPEGs of ``column``, flip each with p = 1/2, crop a
    random CROP x CROP window; returns the batch with ``column`` as uint8 ``[B, 3, CROP, CROP]``.

    Each image is decoded into a small per-thread buffer (cache-resident) and its crop copied
    once into the batch array. An image to flip is decoded as BGR; reversing the bytes of its
    rows (all flipped images at once, :func:`_flip_rows`) then reverses its pixels and makes it
    RGB again. The tensor is that array's view, in ``torch.channels_last`` layout (NHWC memory,
    NCHW shape). Making it channels-first on the CPU would be one more strided pass over every
    byte (+25% of the decode, measured); models on a GPU prefer channels_last anyway, and
    ``.contiguous()`` there is nearly free.
    """

    def __init__(self, column: str = "image") -> None:
        self.column = column

    def __call__(self, batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        import torch

        decode = _decoder().decode_jpeg
        images = batch[self.column]
        n = len(images)
        keys = rng.integers(0, _SPAN * _SPAN * 2, n)  # (y * _SPAN + x) * 2 + flip
        out = np.empty((n, CROP, CROP * 3), np.uint8)
        buf, views = _scratch()
        for data, dst, key in zip(images, out, keys.tolist(), strict=True):
            decode(data, colorspace="BGR" if key & 1 else "RGB", buffer=buf)
            np.copyto(dst, views[key >> 1])
        _flip_rows(out, np.flatnonzero(keys & 1))
        batch[self.column] = torch.from_numpy(out.reshape(n, CROP, CROP, 3)).permute(0, 3, 1, 2)
        return batch


class DecodeOnly:
    """``transform(batch)``: the floor's work in pqloader: every JPEG decoded into one
    ``[B, SIZE, SIZE, 3]`` uint8 array, no augmentation (a diagnostic, not a method to copy)."""

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import torch

        decode = _decoder().decode_jpeg
        images = batch["image"]
        out = np.empty((len(images), SIZE, SIZE, 3), np.uint8)
        for data, dst in zip(images, out, strict=True):
            decode(data, colorspace="RGB", buffer=dst)
        batch["image"] = torch.from_numpy(out).permute(0, 3, 1, 2)
        return batch


# -- the methods, each run in a child process -------------------------------------------------
def _cpu_s() -> float:
    """CPU seconds of this process and its reaped children (worker processes), all threads."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _tasks(path: Path) -> list[tuple[str, int]]:
    return [(str(f), i) for f in sorted(path.glob("*.parquet"))
            for i in range(pq.read_metadata(f).num_row_groups)]


def _decode_row_group(task: tuple[str, int]) -> tuple[int, int]:
    """Read one row group's bytes and labels, decode every JPEG into a reused array."""
    decode = _decoder().decode_jpeg
    table = pq.ParquetFile(task[0]).read_row_group(task[1], columns=["image", "label"],
                                                   use_threads=False)
    out = getattr(_local, "floor_out", None)
    if out is None:
        out = _local.floor_out = np.empty((256, SIZE, SIZE, 3), np.uint8)
    k = 0
    for chunk in table.column("image").chunks:
        _, offsets_buf, data_buf = chunk.buffers()
        offsets = np.frombuffer(offsets_buf, np.int32)[chunk.offset:chunk.offset + len(chunk) + 1]
        data = memoryview(data_buf).cast("B")  # pyarrow's buffers are signed char
        for start, end in itertools.pairwise(offsets.tolist()):
            decode(data[start:end], colorspace="RGB", buffer=out[k])
            k = (k + 1) % len(out)
    return table.num_rows, int(table.column("label").to_numpy().sum())


def run_floor(path: Path, args: argparse.Namespace, kind: str) -> dict[str, Any]:
    """The decode loop alone on CORES threads or processes, row groups handed out in order."""
    import multiprocessing
    from concurrent.futures import ThreadPoolExecutor

    tasks = _tasks(path)
    t0, cpu0 = time.perf_counter(), _cpu_s()
    if kind == "threads":
        with ThreadPoolExecutor(CORES) as pool:
            done = list(pool.map(_decode_row_group, tasks))
    else:
        pool = multiprocessing.get_context("fork").Pool(CORES)
        done = list(pool.imap_unordered(_decode_row_group, tasks))
        pool.close()
        pool.join()  # reaped: their CPU time counts in RUSAGE_CHILDREN
    seconds = time.perf_counter() - t0
    return {"rows": sum(r for r, _ in done), "seconds": seconds, "cpu_s": _cpu_s() - cpu0,
            "label_sum": sum(s for _, s in done)}


class TutorialDataset:
    """The tutorial way: one ``df.iloc[i]`` per row, decoded, flipped and cropped in torch."""

    def __init__(self, df: Any) -> None:
        self.df = df

    def __len__(self) -> int:
        return len(self.df)

    def __getitem__(self, i: int) -> Any:
        import torch  # imported here so that the floor's children never load torch

        row = self.df.iloc[i]
        image = torch.from_numpy(_decoder().decode_jpeg(row["image"], colorspace="RGB"))
        image = image.permute(2, 0, 1)
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        y, x = torch.randint(0, _SPAN, (2,)).tolist()
        return image[:, y:y + CROP, x:x + CROP], int(row["label"])


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
    for images, labels in itertools.islice(batches, args.naive_batches):
        if images.shape != (len(labels), 3, CROP, CROP) or images.dtype != torch.uint8:
            sys.exit(f"naive batch is {images.dtype} {tuple(images.shape)}")
        rows += len(labels)
    seconds = time.perf_counter() - t0
    return {"rows": rows, "seconds": seconds, "load_s": load_s}


def run_pqloader(path: Path, args: argparse.Namespace, num_workers: int | str,
                 worker_type: str = "thread", augment: bool = True) -> dict[str, Any]:
    """pqloader's DataLoader, shuffled, every batch consumed; the dataset's opening is timed."""
    import torch

    import pqloader

    t0, cpu0 = time.perf_counter(), _cpu_s()
    ds = pqloader.ParquetDataset(path)
    loader = pqloader.DataLoader(ds, batch_size=args.batch_size, shuffle=True, seed=SEED,
                                 num_workers=num_workers, worker_type=worker_type,
                                 transform=FlipCrop("image") if augment else DecodeOnly())
    side = CROP if augment else SIZE
    rows = label_sum = corner_sum = 0
    for batch in loader:
        images, labels = batch["image"], batch["label"]
        if images.shape != (len(labels), 3, side, side) or images.dtype != torch.uint8:
            sys.exit(f"pqloader batch is {images.dtype} {tuple(images.shape)}")
        rows += len(labels)
        label_sum += int(labels.sum())
        corner_sum += int(images[:, :, 0, 0].sum())
    seconds = time.perf_counter() - t0
    del loader  # process workers exit and are reaped: their CPU time counts
    if rows != len(ds):
        sys.exit(f"delivered {rows:,} rows; the dataset has {len(ds):,}")
    return {"rows": rows, "seconds": seconds, "cpu_s": _cpu_s() - cpu0, "label_sum": label_sum,
            "corner_sum": corner_sum}


CHILDREN = {
    "floor-threads": lambda p, a: run_floor(p, a, "threads"),
    "floor-procs": lambda p, a: run_floor(p, a, "procs"),
    "naive-w0": lambda p, a: run_naive(p, a, 0),
    "naive-w2": lambda p, a: run_naive(p, a, 2),
    "pqloader-w0": lambda p, a: run_pqloader(p, a, 0),
    "pqloader-w2": lambda p, a: run_pqloader(p, a, 2),
    "pqloader-auto": lambda p, a: run_pqloader(p, a, "auto"),
    "pqloader-w2-proc": lambda p, a: run_pqloader(p, a, 2, "process"),
    "pqloader-w2-decode": lambda p, a: run_pqloader(p, a, 2, augment=False),
}


# -- the parent: run, watch, summarise --------------------------------------------------------
def run_child(method: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    result = harness.run_child(__file__, method, [
        "--data", str(path), "--batch-size", str(args.batch_size),
        "--naive-batches", str(args.naive_batches)])
    if "error" not in result:
        result["images_per_s"] = result["rows"] / max(result["seconds"], 1e-9)
        if "cpu_s" in result:  # CPU per image and cores busy: less noisy than the rate
            result["cpu_us_per_image"] = result["cpu_s"] / max(result["rows"], 1) * 1e6
            result["cores_busy"] = result["cpu_s"] / max(result["seconds"], 1e-9)
    return result


def _agree(out: dict[str, Any], group: list[str], key: str) -> None:
    """Every run of the methods in ``group`` must give one value of ``key``."""
    group = [m for m in group if m in out]
    values = {r[key] for m in group for r in out[m]["runs"] if key in r}
    if len(values) > 1:
        for m in group:
            out[m]["errors"].append(f"{key} differs between methods: {sorted(values)}")


def summarise(runs: dict[str, list[dict[str, Any]]], rows: int) -> dict[str, Any]:
    """Per method: median images/s and peak memory over the runs, ratios, failures."""
    out: dict[str, Any] = {}
    for method, results in runs.items():
        ok = [r for r in results if "error" not in r]
        errors = [r["error"] for r in results if "error" in r]
        s: dict[str, Any] = {"runs": results, "errors": errors}
        if ok:
            s.update(images_per_s=statistics.median(r["images_per_s"] for r in ok),
                     peak_rss_mib=round(statistics.median(r["peak_rss_mib"] for r in ok)),
                     peak_pss_mib=round(statistics.median(r["peak_pss_mib"] for r in ok)))
            if "cpu_s" in ok[0]:
                s.update(cpu_us_per_image=statistics.median(r["cpu_us_per_image"] for r in ok),
                         cores_busy=statistics.median(r["cores_busy"] for r in ok))
            if "load_s" in ok[0]:
                s["load_s"] = statistics.median(r["load_s"] for r in ok)
            elif any(r["rows"] != rows for r in ok):
                errors.append(f"delivered {[r['rows'] for r in ok]} rows, expected {rows}")
        out[method] = s
    # Whole epochs see every row once: one label sum. Thread and process workers make the same
    # batches with the same seeds: one checksum of the augmented images; so do 0 workers and
    # "auto" (one stream).
    _agree(out, [m for m in out if not m.startswith("naive")], "label_sum")
    _agree(out, ["pqloader-w2", "pqloader-w2-proc"], "corner_sum")
    _agree(out, ["pqloader-w0", "pqloader-auto"], "corner_sum")
    floors = [s["images_per_s"] for m, s in out.items()
              if m.startswith("floor") and "images_per_s" in s]
    naive = [s["images_per_s"] for m, s in out.items()
             if m.startswith("naive") and "images_per_s" in s]
    floor_runs = [f["runs"] for m, f in out.items() if m.startswith("floor")]
    for s in out.values():
        if "images_per_s" in s:
            s["x_floor"] = s["images_per_s"] / max(floors) if floors else None
            s["x_best_naive"] = s["images_per_s"] / max(naive) if naive else None
            s["x_floor_paired"] = harness.paired(s["runs"], floor_runs, "images_per_s")
    return out


def print_table(summary: dict[str, Any], args: argparse.Namespace) -> None:
    def ratio(x: float | None) -> str:  # small ratios keep two significant digits
        if x is None:
            return "-"
        return f"{x:,.0f}" if x >= 100 else f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"

    print(f"\nimage batches: {args.rows:,} rows of {SIZE}x{SIZE} RGB JPEG (quality {QUALITY}) + "
          f"int64 label, {args.files} files, {args.row_group_size:,}-row groups; decode + random "
          f"flip + random {CROP}x{CROP} crop, batch {args.batch_size}; median of {args.repeats}")
    print(f"{'method':<18}{'images/s':>10}{'x floor':>9}{'paired':>8}{'x naive':>9}"
          f"{'CPU us/img':>12}{'cores':>7}{'peak RSS MiB':>14}{'peak PSS MiB':>14}")
    for method, s in summary.items():
        if "images_per_s" not in s:
            print(f"{method:<18}  FAILED: {s['errors'][0]}")
            continue
        star = "*" if method.startswith("naive") else ""
        cpu = f"{s['cpu_us_per_image']:.1f}" if "cpu_us_per_image" in s else "-"
        cores = f"{s['cores_busy']:.2f}" if "cores_busy" in s else "-"
        print(f"{method + star:<18}{s['images_per_s']:>10,.0f}{ratio(s['x_floor']):>9}"
              f"{ratio(s['x_floor_paired']):>8}{ratio(s['x_best_naive']):>9}{cpu:>12}{cores:>7}{s['peak_rss_mib']:>14,}"
              f"{s['peak_pss_mib']:>14,}")
    if any(m.startswith("naive") for m in summary):
        loads = ", ".join(f"{m} {s['load_s']:.1f} s" for m, s in summary.items() if "load_s" in s)
        print(f"* naive: images/s over {args.naive_batches} batches after the first; the load "
              f"(pd.read_parquet) and the first batch are not counted ({loads})")
    print(f"floor: simplejpeg decode alone on {CORES} threads / processes, file order, no "
          "augmentation; x floor is against the faster; paired: the median over rounds of the "
          "ratio to the faster floor of the same round. pqloader: shuffled, every row, timed "
          "from opening the dataset. CPU us/img and cores: CPU time of the process and its "
          "workers (getrusage) per image and per second of the run. Peak memory of the process "
          "tree, median of the runs' peaks: RSS counts shared pages once per process, PSS "
          "splits them.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--row-group-size", type=int, default=5_000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3, help="runs per method; medians reported")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of "
                   + ", ".join(METHODS + EXTRA_METHODS))
    p.add_argument("--data", type=Path, help="dataset folder, reused when it holds the same "
                   "rows, files and row groups (default: one under the temp dir)")
    p.add_argument("--tiny", action="store_true",
                   help="6k rows, 2 files, 1000-row groups, 1 repeat: a smoke run")
    p.add_argument("--naive-batches", type=int, default=40, help=argparse.SUPPRESS)
    p.add_argument("--child", choices=METHODS + EXTRA_METHODS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tiny:
        args.rows, args.files, args.row_group_size, args.repeats = 6_000, 2, 1_000, 1
        args.naive_batches = min(args.naive_batches, 5)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if unknown := sorted(set(args.methods) - set(METHODS + EXTRA_METHODS)):
        p.error(f"unknown methods {unknown}; choose among {', '.join(METHODS + EXTRA_METHODS)}")
    if args.data is None:
        args.data = Path(tempfile.gettempdir()) / (
            f"pqloader-bench-images-{args.rows}x{args.files}-{args.row_group_size}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print("CHILD " + json.dumps(CHILDREN[args.child](args.data, args)), flush=True)
        return 0
    commit = harness.commit()  # before the runs: others may commit while they go on
    ensure_data(args.data, args.rows, args.files, args.row_group_size)
    runs = harness.interleave(args.methods, args.repeats,
                              lambda m: run_child(m, args.data, args),
                              lambda r: f"{r['images_per_s']:,.0f} images/s")
    summary = summarise(runs, args.rows)
    print_table(summary, args)
    print("RESULT " + json.dumps({
        "benchmark": "images", "commit": commit, "rows": args.rows, "files": args.files,
        "row_group_size": args.row_group_size, "batch_size": args.batch_size, "size": SIZE,
        "crop": CROP, "quality": QUALITY, "decoder": "simplejpeg", "cores": CORES,
        "repeats": args.repeats, "naive_batches": args.naive_batches, "methods": summary,
    }))
    return 1 if any(s["errors"] for s in summary.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
