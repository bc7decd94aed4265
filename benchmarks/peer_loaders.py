"""The peers' loaders, each with its documented fast path, run inside the peer's own venv.

Every loader yields batches as a dict of tensors with pqloader's keys: the workload's columns,
and for a list column (W2) the column padded with 0 to the batch's longest row plus
``{column}_lengths``. Conversions (MDS, Lance, the `datasets` Arrow cache) are made once by
``prepare`` into the peer's folder beside the data, and reused.

Imports only numpy and pyarrow at the top: each peer venv has those, and nothing else is shared.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import types
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# method -> the venv (peers.PEERS) it runs in
METHODS = {
    "hf-map": "hf", "hf-map-batched": "hf", "hf-stream": "hf", "petastorm": "petastorm",
    "mosaic": "mosaic", "ray": "ray", "lance": "lance",
}
# what converts (once, timed): the folder under the peer dir that ``prepare`` fills
CONVERTS = {"hf-map": "hf-cache", "hf-map-batched": "hf-cache", "mosaic": "mds",
            "lance": "lance"}


@dataclass(frozen=True)
class Workload:
    """What a peer must deliver, and how."""

    data: Path  # the Parquet folder
    out: Path  # the peer's folder for conversions
    batch_size: int
    list_column: str | None  # W2's "tokens": padded, with lengths
    seed: int
    num_workers: int = 2  # torch DataLoader workers, where a peer uses one
    buffer_rows: int = 10_000  # shuffle buffer, where a peer shuffles through one

    @property
    def files(self) -> list[str]:
        return [str(p) for p in sorted(self.data.glob("*.parquet"))]


# -- padding, shared -----------------------------------------------------------------------------
def pad_arrow(lists: pa.ListArray | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """An Arrow list column padded with numpy from its offsets (no per-row Python)."""
    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    offsets = lists.offsets.to_numpy()
    lengths = np.diff(offsets)
    values = lists.values.to_numpy()[offsets[0]:offsets[-1]]
    mask = np.arange(lengths.max(initial=0)) < lengths[:, None]
    out = np.zeros(mask.shape, dtype=values.dtype)
    out[mask] = values
    return out, lengths


def pad_rows(rows: list[Any]) -> tuple[Any, Any]:
    """Rows of a list column (tensors or arrays, one per sample) padded with ``pad_sequence``."""
    import torch
    from torch.nn.utils.rnn import pad_sequence

    tensors = [torch.as_tensor(r) for r in rows]
    return (pad_sequence(tensors, batch_first=True, padding_value=0),
            torch.tensor([len(t) for t in tensors]))


def collate_samples(column: str | None) -> Any:
    """A collate_fn for per-sample peers: torch's default, except the list column is padded."""
    import torch
    from torch.utils.data import default_collate

    def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
        if column is None:
            return default_collate(samples)  # type: ignore[no-any-return]
        out = default_collate([{k: v for k, v in s.items() if k != column} for s in samples])
        out[column], out[f"{column}_lengths"] = pad_rows([s[column] for s in samples])
        return {k: torch.as_tensor(v) for k, v in out.items()}

    return collate


def _torch_loader(dataset: Any, w: Workload, **kwargs: Any) -> Any:
    import torch

    generator = torch.Generator().manual_seed(w.seed)
    return torch.utils.data.DataLoader(dataset, num_workers=w.num_workers,
                                       generator=generator, **kwargs)


# -- Hugging Face datasets ----------------------------------------------------------------------
def _hf_dataset(w: Workload) -> Any:
    from datasets import disable_progress_bars, load_dataset

    disable_progress_bars()
    return load_dataset("parquet", data_files=w.files, split="train",
                        cache_dir=str(w.out / "hf-cache"))


def hf_map(w: Workload) -> Generator[dict[str, Any], None, None]:
    """The documented way: ``with_format("torch")`` + torch's DataLoader, shuffled. The loader
    fetches each batch with ``__getitems__`` and collates it sample by sample."""
    ds = _hf_dataset(w).with_format("torch")
    yield from _torch_loader(ds, w, batch_size=w.batch_size, shuffle=True,
                             collate_fn=collate_samples(w.list_column))


def hf_map_batched(w: Workload) -> Generator[dict[str, Any], None, None]:
    """The fastest map-style way we know: the sampler yields whole batches of indices, so each
    fetch is one ``ds[indices]`` (columnar) and nothing is collated sample by sample."""
    import torch

    ds = _hf_dataset(w).with_format("torch")
    generator = torch.Generator().manual_seed(w.seed)
    sampler = torch.utils.data.BatchSampler(
        torch.utils.data.RandomSampler(ds, generator=generator), w.batch_size, drop_last=False)
    column = w.list_column

    def collate(batch: dict[str, Any]) -> dict[str, Any]:
        if column is not None:
            batch[column], batch[f"{column}_lengths"] = pad_rows(batch[column])
        return batch

    yield from _torch_loader(ds, w, batch_size=None, sampler=sampler, collate_fn=collate)


def hf_stream(w: Workload) -> Generator[dict[str, Any], None, None]:
    """``streaming=True`` with a shuffle buffer of ``buffer_rows`` (and shard order shuffled)."""
    from datasets import load_dataset

    ids = load_dataset("parquet", data_files=w.files, split="train", streaming=True)
    ids = ids.shuffle(seed=w.seed, buffer_size=w.buffer_rows).with_format("torch")
    yield from _torch_loader(ids, w, batch_size=w.batch_size,
                             collate_fn=collate_samples(w.list_column))


# -- Petastorm ----------------------------------------------------------------------------------
def petastorm(w: Workload) -> Generator[dict[str, Any], None, None]:
    """``make_batch_reader`` (row groups shuffled, 2 reader threads) and Petastorm's torch
    loader with a shuffling queue: ``BatchedDataLoader`` for scalar columns; ragged lists need
    the per-row ``DataLoader`` with a padding collate_fn."""
    from petastorm import make_batch_reader
    from petastorm.pytorch import BatchedDataLoader, DataLoader

    with make_batch_reader([f"file://{f}" for f in w.files], num_epochs=1, seed=w.seed,
                           shuffle_row_groups=True, workers_count=w.num_workers) as reader:
        if w.list_column is None:
            loader = BatchedDataLoader(reader, batch_size=w.batch_size,
                                       shuffling_queue_capacity=w.buffer_rows)
        else:
            loader = DataLoader(reader, batch_size=w.batch_size,
                                collate_fn=collate_samples(w.list_column),
                                shuffling_queue_capacity=w.buffer_rows)
        yield from loader


# -- MosaicML Streaming -------------------------------------------------------------------------
def _streaming() -> Any:
    """``streaming.base`` without the package's ``__init__``, which imports streaming.vision and
    so torchvision (the CUDA build that pip resolves, which fails to import beside CPU torch)."""
    if "streaming" not in sys.modules:
        spec = importlib.util.find_spec("streaming")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("mosaicml-streaming is not installed in this venv")
        package = types.ModuleType("streaming")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["streaming"] = package
    import streaming.base

    return streaming.base


def _mds_convert(w: Workload, out: Path) -> None:
    """Parquet to MDS, row by row (MDSWriter takes one dict per sample): W1's 32 features as
    one ``float32`` vector, W2's tokens as a variable-length ``int32`` array."""
    writer_cls = _streaming().MDSWriter
    if w.list_column is None:
        columns = {"features": "ndarray:float32:32", "label": "int64"}
    else:
        columns = {w.list_column: "ndarray:int32", "label": "int64"}
    with writer_cls(out=str(out), columns=columns) as writer:
        for file in w.files:
            pf = pq.ParquetFile(file)
            for i in range(pf.num_row_groups):
                table = pf.read_row_group(i)
                labels = table.column("label").to_numpy()
                if w.list_column is None:
                    features = np.stack([table.column(n).to_numpy() for n in table.column_names
                                         if n != "label"], axis=1)
                    for x, y in zip(features, labels, strict=True):
                        writer.write({"features": x, "label": int(y)})
                else:
                    lists = table.column(w.list_column).combine_chunks()
                    offsets, values = lists.offsets.to_numpy(), lists.values.to_numpy()
                    for j, y in enumerate(labels):
                        writer.write({w.list_column: values[offsets[j]:offsets[j + 1]],
                                      "label": int(y)})


def mosaic(w: Workload) -> Generator[dict[str, Any], None, None]:
    """``StreamingDataset`` over the local MDS shards, shuffled (its default py1e block
    shuffle), fed to torch's DataLoader."""
    base = _streaming()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    ds = base.StreamingDataset(local=str(w.out / "mds"), shuffle=True, shuffle_seed=w.seed,
                               batch_size=w.batch_size)
    yield from _torch_loader(ds, w, batch_size=w.batch_size,
                             collate_fn=collate_samples(w.list_column))


# -- Ray Data -----------------------------------------------------------------------------------
def ray(w: Workload) -> Generator[dict[str, Any], None, None]:
    """``read_parquet`` + ``iter_torch_batches`` with a local shuffle buffer; for a ragged list
    column, a collate_fn that pads with numpy (tensors cannot be ragged)."""
    import ray as ray_
    import torch

    ray_.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
              logging_level="ERROR")
    try:
        ds = ray_.data.read_parquet(str(w.data))
        kwargs: dict[str, Any] = {}
        column = w.list_column
        if column is not None:
            def collate(batch: dict[str, np.ndarray]) -> dict[str, Any]:
                rows = batch.pop(column)
                lengths = np.fromiter((len(r) for r in rows), np.int64, len(rows))
                padded = np.zeros((len(rows), lengths.max(initial=0)), np.int32)
                for j, r in enumerate(rows):
                    padded[j, :len(r)] = r
                out = {k: torch.as_tensor(v) for k, v in batch.items()}
                out[column] = torch.from_numpy(padded)
                out[f"{column}_lengths"] = torch.from_numpy(lengths)
                return out

            kwargs["collate_fn"] = collate
        yield from ds.iter_torch_batches(batch_size=w.batch_size,
                                         local_shuffle_buffer_size=w.buffer_rows,
                                         local_shuffle_seed=w.seed, **kwargs)
    finally:
        ray_.shutdown()


# -- Lance --------------------------------------------------------------------------------------
def _lance_convert(w: Workload, out: Path) -> None:
    import lance
    import pyarrow.dataset as pads

    lance.write_dataset(pads.dataset(w.files, format="parquet").scanner().to_reader(), str(out))


def lance(w: Workload) -> Generator[dict[str, Any], None, None]:
    """``lance.torch.data.LanceDataset`` over the converted dataset, shuffled by its
    ``ShardedBatchSampler(randomize=True)``: batch order only, the rows of a batch stay
    contiguous (Lance has no row-level shuffle). Iterated in this process (Lance is not
    fork-safe); a list column is padded from its Arrow offsets in ``to_tensor_fn``."""
    import torch
    from lance.sampler import ShardedBatchSampler
    from lance.torch.data import LanceDataset

    column = w.list_column

    def to_tensors(batch: pa.RecordBatch, *args: Any, **kwargs: Any) -> dict[str, Any]:
        out = {n: torch.from_numpy(batch.column(n).to_numpy(zero_copy_only=False))
               for n in batch.schema.names if n != column}
        if column is not None:
            padded, lengths = pad_arrow(batch.column(column))
            out[column], out[f"{column}_lengths"] = (torch.from_numpy(padded),
                                                     torch.from_numpy(lengths))
        return out

    sampler = ShardedBatchSampler(rank=0, world_size=1, randomize=True, seed=w.seed)
    yield from LanceDataset(str(w.out / "lance"), batch_size=w.batch_size, sampler=sampler,
                            to_tensor_fn=to_tensors)


LOADERS = {"hf-map": hf_map, "hf-map-batched": hf_map_batched, "hf-stream": hf_stream,
           "petastorm": petastorm, "mosaic": mosaic, "ray": ray, "lance": lance}


# -- the child's two jobs ----------------------------------------------------------------------
def prepare(method: str, w: Workload) -> dict[str, Any]:
    """Convert the data for ``method`` once (timed), into ``w.out``; a later call reuses it."""
    target = CONVERTS.get(method)
    if target is None:
        return {"convert_s": None}
    out, done = w.out / target, w.out / f"{target}.json"
    if done.exists():
        return {**json.loads(done.read_text()), "reused": True}
    t0 = time.perf_counter()
    if target == "hf-cache":
        _hf_dataset(w)
    elif target == "mds":
        _mds_convert(w, out)
    else:
        _lance_convert(w, out)
    info = {"convert_s": time.perf_counter() - t0}
    done.write_text(json.dumps(info))
    return {**info, "reused": False}


def measure(method: str, w: Workload, consume: Callable[[dict[str, Any]], dict[str, int]],
            seconds: float) -> dict[str, Any]:
    """Iterate ``method``'s batches; the first batch (start-up) is not timed; stop at the end
    of the epoch or after ``seconds``. ``consume(batch)`` returns a dict of counts to add."""
    t0 = time.perf_counter()
    batches = LOADERS[method](w)
    first = next(batches)
    start_s = time.perf_counter() - t0
    totals = consume(first)
    n, epoch = 0, True
    t0 = time.perf_counter()
    for batch in batches:
        for k, v in consume(batch).items():
            totals[f"timed_{k}"] = totals.get(f"timed_{k}", 0) + v
        n += 1
        if time.perf_counter() - t0 > seconds:
            epoch = False
            break
    elapsed = time.perf_counter() - t0
    batches.close()
    return {**totals, "seconds": elapsed, "timed_batches": n, "first_batch_s": start_s,
            "whole_epoch": epoch}
