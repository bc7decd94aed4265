"""filter= under real workers: threads, processes, torch's own workers, ranks and an elastic
resume each deliver the kept rows exactly once, and nothing else."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch.utils.data

import pqloader

BATCH = 16
KEEP = (pc.field("x") > 0.3) & (pc.bit_wise_and(pc.field("id"), 3) != 0)  # ~half the rows


@pytest.fixture
def path(make_dataset: Any) -> Path:
    return make_dataset(1000)  # 4 files, 10 row groups of 100 rows


@pytest.fixture
def kept(path: Path) -> list[int]:
    files = sorted(path.glob("*.parquet"))
    return sorted(i for f in files for i in pq.read_table(f, filters=KEEP)["id"].to_pylist())


def _ids(batches: Any) -> list[int]:
    return [i for batch in batches for i in batch["id"].tolist()]


@pytest.mark.parametrize("mode", [
    pytest.param({"num_workers": 0}, id="inline"),
    pytest.param({"num_workers": 2}, id="threads"),
    pytest.param({"num_workers": 2, "worker_type": "process"}, id="processes"),
    pytest.param({"num_workers": "auto"}, id="auto"),
])
def test_every_kept_row_once(path: Path, kept: list[int], mode: dict[str, Any]) -> None:
    ds = pqloader.ParquetDataset(path, columns=["id", "tokens"], filter=KEEP)
    loader = pqloader.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=3, **mode)
    ids = _ids(loader)
    assert sorted(ids) == kept
    assert ids != kept  # shuffled
    assert len(loader) == -(-len(kept) // BATCH)


def test_ranks_share_the_kept_rows(path: Path, kept: list[int]) -> None:
    ds = pqloader.ParquetDataset(path, filter=KEEP)
    per_rank = [_ids(pqloader.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=1, rank=r,
                                         world_size=3, drop_last=True, num_workers=2))
                for r in range(3)]
    assert len({len(ids) for ids in per_rank}) == 1  # even ranks
    seen = collections.Counter(i for ids in per_rank for i in ids)
    assert max(seen.values()) == 1
    assert set(seen) <= set(kept)
    assert len(kept) - len(seen) < 3 * BATCH


def test_to_torch_under_torch_workers(path: Path, kept: list[int]) -> None:
    ds = pqloader.ParquetDataset(path, filter=KEEP)
    it = ds.to_torch(batch_size=BATCH, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2)
    assert sorted(_ids(loader)) == kept


def test_elastic_resume_keeps_to_the_kept_rows(path: Path, kept: list[int]) -> None:
    ds = pqloader.ParquetDataset(path, filter=KEEP)
    first = pqloader.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=5, num_workers=2,
                                worker_type="process")
    before: list[int] = []
    for batch in first:
        before += batch["id"].tolist()
        if len(before) >= 10 * BATCH:
            break
    state = json.loads(json.dumps(first.state_dict()))
    second = pqloader.DataLoader(pqloader.ParquetDataset(path, filter=KEEP), batch_size=BATCH,
                                 shuffle=True, seed=5, num_workers=3)
    second.load_state_dict(state)
    after = _ids(second)
    assert sorted(before + after) == kept
