"""pqloader over gs:// against a real local GCS emulator (gcp-storage-emulator, through gcsfs).

The same dataset and row checks as the S3 tiers in test_remote.py; each test checks the rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import servers
from test_remote import ROWS, _exactly_once, _ids, local_dataset  # noqa: F401 - a fixture

import pqloader


def test_emulator_serves_gcsfs_and_leaves_nothing_behind(
        gcs_emulator: servers.GcsEmulator, make_dataset: Callable[..., Path]) -> None:
    import gcsfs

    url = gcs_emulator.upload_dir(make_dataset(1000), prefix="a/b")
    assert url.startswith("gs://pq-") and url.endswith("/a/b")
    fs = gcsfs.GCSFileSystem(**gcs_emulator.storage_options, skip_instance_cache=True)
    # the plain filesystem: with the layout probe (conftest turns it off) each call takes 60 s
    assert type(fs).__name__ == "GCSFileSystem"
    files = sorted(f for f in fs.find(url) if f.endswith(".parquet"))
    assert len(files) == 4
    assert fs.cat_file(files[0], start=0, end=4) == b"PAR1"  # ranges work
    ids = sorted(i for f in files for i in pq.read_table(f, filesystem=fs)["id"].to_pylist())
    assert ids == list(range(1000))
    with servers.GcsEmulator() as other:
        procs, folder = [p for p, _ in other._procs], other.dir
        assert all(p.poll() is None for p in procs) and folder.is_dir()
    assert all(p.poll() is not None for p in procs) and not folder.exists()


@pytest.mark.parametrize("worker_type, context", [("thread", None), ("process", "fork"),
                                                   ("process", "spawn")])
def test_gs_every_row_exactly_once(gcs_emulator: servers.GcsEmulator,
                                   local_dataset: Path,  # noqa: F811 - the imported fixture
                                   worker_type: str, context: str | None) -> None:
    url = gcs_emulator.upload_dir(local_dataset)
    ds = pqloader.ParquetDataset(url, storage_options=gcs_emulator.storage_options)
    assert len(ds) == ROWS and ds.columns["part"] == pa.int64()
    assert len(ds.files) == 4 and all(f.startswith(url) for f in ds.files)
    opened = ds.io_stats()["requests"]  # what opening read
    loader = pqloader.DataLoader(ds, batch_size=512, shuffle=True, num_workers=2,
                                 worker_type=worker_type,
                                 multiprocessing_context=context,
                                 persistent_workers=context == "spawn")  # spawn once: ~3 s
    for epoch in range(2):
        loader.set_epoch(epoch)
        _exactly_once(_ids(loader))
    # every row group fetched at least once per epoch, counted in worker processes too
    assert ds.io_stats()["requests"] - opened >= 2 * ds.num_row_groups


def test_gs_warm_cache_makes_no_requests_and_a_changed_object_is_refetched(
        gcs_emulator: servers.GcsEmulator,
        local_dataset: Path,  # noqa: F811 - the imported fixture
        tmp_path: Path) -> None:
    url = gcs_emulator.upload_dir(local_dataset)
    options = gcs_emulator.storage_options
    cache = pqloader.Cache(tmp_path / "cache", max_bytes=1 << 30)
    ds = pqloader.ParquetDataset(url, storage_options=options, cache=cache)
    _exactly_once(_ids(pqloader.DataLoader(ds, batch_size=512, shuffle=True, num_workers=2)))
    cold = ds.io_stats()

    warm_ds = pqloader.ParquetDataset(url, storage_options=options, cache=cache)
    loader = pqloader.DataLoader(warm_ds, batch_size=512, shuffle=True, num_workers=2)
    for epoch in range(2):
        loader.set_epoch(epoch)
        _exactly_once(_ids(loader))
    warm = warm_ds.io_stats()
    assert cold["requests"] > 0 and warm["requests"] == 0  # listing is not a data GET
    assert warm["cache_hits"] >= cold["cache_misses"]

    # Upload other values over one object: a new generation and md5, so the cache must miss.
    bucket, _, name = next(f for f in ds.files if "part=0" in f).removeprefix("gs://").partition(
        "/")
    ids = np.arange(0, 6000, 2)
    table = pa.table({"id": ids, "x": ids.astype(np.float32) / 7,
                      "tok": pa.array([[int(i)] * int(i % 5) for i in ids], pa.list_(pa.int32()))})
    pqloader.write_dataset(table, tmp_path / "rewritten", rows_per_file=10_000,
                           row_group_size=500)
    gcs_emulator.upload_file(next((tmp_path / "rewritten").glob("*.parquet")), bucket, name)
    fresh = pqloader.ParquetDataset(url, storage_options=options, cache=cache)
    assert fresh.io_stats()["cache_misses"] > 0  # the new footer
    # The same rows in 500-row groups: a stale footer would still say 1,000-row groups.
    assert fresh.num_row_groups == ds.num_row_groups + 3
    _exactly_once(_ids(pqloader.DataLoader(fresh, batch_size=512, shuffle=True, num_workers=2)))


def test_gs_missing_bucket_is_a_clear_error(gcs_emulator: servers.GcsEmulator) -> None:
    with pytest.raises(pqloader.PQLoaderError, match="gs://no-such-bucket-pq"):
        pqloader.ParquetDataset("gs://no-such-bucket-pq/data",
                                storage_options=gcs_emulator.storage_options)


@pytest.mark.parametrize("status", [503, 429])
def test_throttled_gs_completes_exactly_once_and_counts_every_retry(
        gcs_proxy: Callable[..., servers.GcsFaultProxy],
        local_dataset: Path,  # noqa: F811 - the imported fixture
        status: int) -> None:
    proxy = gcs_proxy(rate_per_s=20, burst=5, status=status)
    url = proxy.upload_dir(local_dataset)
    policy = pqloader.RetryPolicy(base_delay_s=0.05, max_delay_s=1.0, attempts=30)
    ds = pqloader.ParquetDataset(url, storage_options=proxy.storage_options, retry=policy,
                                 cache=None)
    _exactly_once(_ids(pqloader.DataLoader(ds, batch_size=512, shuffle=True, num_workers=2)))
    stats, served = ds.io_stats(), proxy.settled_requests()
    throttled = sum(r.status == status for r in served)
    # Each refusal nginx sent is one retry pqloader counted: gcsfs retried none on its own.
    assert throttled > 0 and stats["retries"] == stats["throttled"] == throttled
    assert stats["requests"] == sum(r.path.startswith("/download/") and r.status < 300
                                    for r in served)


def test_gs_forbidden_is_not_retried(gcs_proxy: Callable[..., servers.GcsFaultProxy],
                                    local_dataset: Path) -> None:  # noqa: F811
    proxy = gcs_proxy(rate_per_s=1 / 60, status=403)  # the listing passes, then all is refused
    url = proxy.upload_dir(local_dataset)
    with pytest.raises(pqloader.PQLoaderError, match="Forbidden") as caught:
        pqloader.ParquetDataset(url, storage_options=proxy.storage_options)
    _asked_once(caught.value, proxy, 403)


def test_gs_object_gone_is_not_retried(gcs_proxy: Callable[..., servers.GcsFaultProxy],
                                       gcs_emulator: servers.GcsEmulator,
                                       local_dataset: Path) -> None:  # noqa: F811
    import gcsfs

    proxy = gcs_proxy()
    ds = pqloader.ParquetDataset(proxy.upload_dir(local_dataset),
                                 storage_options=proxy.storage_options)
    gcsfs.GCSFileSystem(**gcs_emulator.storage_options, skip_instance_cache=True).rm(ds.files)
    with pytest.raises(pqloader.PQLoaderError, match="no such object") as caught:
        ds[0]
    _asked_once(caught.value, proxy, 404)
    assert ds.io_stats()["retries"] == 0


def _asked_once(error: BaseException, proxy: servers.GcsFaultProxy, status: int) -> None:
    """The error came at the first attempt: nginx refused with ``status``, and no refused
    request was asked again."""
    assert "gave up" not in str(error)
    served = proxy.settled_requests()
    asked = Counter((r.method, r.path, r.query, r.range) for r in served)
    refused = [r for r in served if r.status == status]
    assert refused and all(asked[r.method, r.path, r.query, r.range] == 1 for r in refused)
