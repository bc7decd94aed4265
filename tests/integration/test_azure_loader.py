"""pqloader over az:// against the local Azure Blob server (tests/azure_blob_server.py), through
adlfs and the real Azure SDK: every row once, the cache, and retries pqloader owns and counts.

The same dataset and row checks as the S3 tiers in test_remote.py and the gs:// ones.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import servers
from test_remote import ROWS, _exactly_once, _ids, local_dataset  # noqa: F401 - a fixture

import pqloader


@pytest.fixture
def az(azure_blob: servers.AzureBlobServer) -> Iterator[servers.AzureBlobServer]:
    """The session's server, its fault switch cleared after each test."""
    yield azure_blob
    azure_blob.faults(503, "ServerBusy", 0)


@pytest.mark.parametrize("worker_type, context", [("thread", None), ("process", "fork")])
def test_az_every_row_exactly_once(az: servers.AzureBlobServer,
                                   local_dataset: Path,  # noqa: F811 - the imported fixture
                                   worker_type: str, context: str | None) -> None:
    url = az.upload_dir(local_dataset)
    ds = pqloader.ParquetDataset(url, storage_options=az.storage_options())
    assert len(ds) == ROWS and ds.columns["part"] == pa.int64()
    assert len(ds.files) == 4 and all(f.startswith(url) for f in ds.files)
    opened = ds.io_stats()["requests"]
    loader = pqloader.DataLoader(ds, batch_size=512, shuffle=True, num_workers=2,
                                 worker_type=worker_type, multiprocessing_context=context)
    for epoch in range(2):
        loader.set_epoch(epoch)
        _exactly_once(_ids(loader))
    assert ds.io_stats()["requests"] - opened >= 2 * ds.num_row_groups


def test_az_warm_cache_makes_no_requests_and_a_changed_blob_is_refetched(
        az: servers.AzureBlobServer,
        local_dataset: Path,  # noqa: F811 - the imported fixture
        tmp_path: Path) -> None:
    url = az.upload_dir(local_dataset)
    options = az.storage_options()
    cache = pqloader.Cache(tmp_path / "cache", max_bytes=1 << 30)
    ds = pqloader.ParquetDataset(url, storage_options=options, cache=cache)
    _exactly_once(_ids(pqloader.DataLoader(ds, batch_size=512, shuffle=True, num_workers=2)))
    cold = ds.io_stats()
    warm_ds = pqloader.ParquetDataset(url, storage_options=options, cache=cache)
    _exactly_once(_ids(pqloader.DataLoader(warm_ds, batch_size=512, shuffle=True,
                                           num_workers=2)))
    warm = warm_ds.io_stats()
    assert cold["requests"] > 0 and warm["requests"] == 0  # listing is not a data GET
    assert warm["cache_hits"] >= cold["cache_misses"]

    # Other values over one blob: a new ETag, so the cache must miss.
    container, _, name = next(f for f in ds.files if "part=0" in f).removeprefix(
        "az://").partition("/")
    ids = np.arange(0, 6000, 2)
    table = pa.table({"id": ids, "x": ids.astype(np.float32) / 7,
                      "tok": pa.array([[int(i)] * int(i % 5) for i in ids], pa.list_(pa.int32()))})
    pqloader.write_dataset(table, tmp_path / "rewritten", rows_per_file=10_000,
                           row_group_size=500)
    target = az.root / container / name
    shutil.copyfile(next((tmp_path / "rewritten").glob("*.parquet")), target.with_suffix(".tmp"))
    target.with_suffix(".tmp").replace(target)
    fresh = pqloader.ParquetDataset(url, storage_options=options, cache=cache)
    assert fresh.io_stats()["cache_misses"] > 0  # the new footer
    assert fresh.num_row_groups == ds.num_row_groups + 3  # a stale footer says 1,000-row groups
    _exactly_once(_ids(pqloader.DataLoader(fresh, batch_size=512, shuffle=True, num_workers=2)))


def test_az_missing_container_is_a_clear_error(az: servers.AzureBlobServer) -> None:
    with pytest.raises(pqloader.PQLoaderError, match="no-such-container-pq"):
        pqloader.ParquetDataset("az://no-such-container-pq/data",
                                storage_options=az.storage_options())


@pytest.mark.parametrize("status, code", [(503, "ServerBusy"), (500, "InternalError")])
def test_az_faults_are_retried_by_pqloader_alone_and_counted(
        az: servers.AzureBlobServer,
        local_dataset: Path,  # noqa: F811 - the imported fixture
        status: int, code: str) -> None:
    url = az.upload_dir(local_dataset)
    policy = pqloader.RetryPolicy(base_delay_s=0.01, max_delay_s=0.1, attempts=10)
    ds = pqloader.ParquetDataset(url, storage_options=az.storage_options(), retry=policy)
    before = az.stats()
    az.faults(status, code, 6)  # the next 6 GETs (data reads) fail
    _exactly_once(_ids(pqloader.DataLoader(ds, batch_size=512, shuffle=True, num_workers=2)))
    served = az.stats()["faults_served"] - before["faults_served"]
    stats = ds.io_stats()
    # Each fault the server sent is one retry pqloader counted: the SDK retried none itself
    # (it would have slept 15 s before its first).
    assert served == 6 and stats["retries"] == 6
    assert stats["throttled"] == (6 if status == 503 else 0)


def test_az_forbidden_is_not_retried(az: servers.AzureBlobServer,
                                     local_dataset: Path) -> None:  # noqa: F811
    url = az.upload_dir(local_dataset)
    ds = pqloader.ParquetDataset(url, storage_options=az.storage_options())
    before = az.stats()
    az.faults(403, "AuthorizationFailure", 100)
    with pytest.raises(pqloader.PQLoaderError, match="AuthorizationFailure") as caught:
        ds[0]
    assert "gave up" not in str(caught.value)
    assert az.stats()["faults_served"] - before["faults_served"] == 1  # asked once
    assert ds.io_stats()["retries"] == 0
