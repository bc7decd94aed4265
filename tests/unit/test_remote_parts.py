"""The parts of remote IO that need no server: retry classes, coalescing, the cache, memory://."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import servers

import pqloader
from pqloader._cache import Cache
from pqloader._footers import tail_range
from pqloader._fs import Store
from pqloader._ranges import coalesce
from pqloader._retry import Limiter, RetryPolicy, classify


class _Status(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


@pytest.mark.parametrize(("exc", "kind"), [
    (_Status(503), "throttled"),
    (_Status(429), "throttled"),
    (OSError("An error occurred (SlowDown): Please reduce your request rate."), "throttled"),
    (_Status(500), "transient"),
    (ConnectionResetError("Connection reset by peer"), "transient"),
    (TimeoutError("read timed out"), "transient"),
    (OSError("Server disconnected"), "transient"),
    (FileNotFoundError("s3://b/k"), "fatal"),
    (PermissionError("Forbidden"), "fatal"),
    (_Status(403), "fatal"),
    (_Status(404), "fatal"),
    (ValueError("bad"), "fatal"),
])
def test_classify(exc: BaseException, kind: str) -> None:
    assert classify(exc) == kind


def test_classify_looks_through_the_cause() -> None:
    try:
        try:
            raise _Status(503)
        except _Status as inner:
            raise OSError("wrapped") from inner
    except OSError as outer:
        assert classify(outer) == "throttled"


@pytest.mark.parametrize(("status", "kind"), [
    (503, "throttled"), (429, "throttled"), (500, "transient"), (502, "transient"),
    (504, "transient"), (408, "transient"), (403, "fatal"), (404, "fatal"), (400, "fatal"),
])
def test_classify_gcsfs_errors(status: int, kind: str) -> None:
    """gcsfs's own errors for each status, as it raises them once its retries are off."""
    from gcsfs.retry import validate_response

    body = json.dumps({"error": {"code": status, "message": "from the server"}}).encode()
    with pytest.raises(Exception) as caught:
        validate_response(status, body, "b/o/part-0.parquet")
    assert classify(caught.value) == kind


@pytest.mark.parametrize("path", ["b/503/part-0.parquet", "b/slowdown-runs/x.parquet",
                                  "b/500/x.parquet", "b/timeout/x.parquet"])
def test_a_status_or_word_in_a_path_is_not_the_error(path: str) -> None:
    """gcsfs's 403 keeps no status: only its message says Forbidden, beside the path."""
    from gcsfs.retry import validate_response

    body = json.dumps({"error": {"code": 403, "message": "from the server"}}).encode()
    with pytest.raises(OSError) as caught:
        validate_response(403, body, path)
    assert classify(caught.value) == "fatal"
    assert classify(OSError(f"Access Denied: s3://{path}")) == "fatal"
    assert classify(OSError(f"reading s3://{path}: HTTP/1.1 503 Slow Down")) == "throttled"
    assert classify(OSError(f"reading https://h/{path}: Connection reset")) == "transient"


def test_gs_store_makes_one_attempt_and_leaves_other_gcsfs_filesystems_alone() -> None:
    import gcsfs

    options = {"endpoint_url": "http://127.0.0.1:9", "token": "anon"}  # nothing listens
    fs = Store("gs", options).fs
    plain = type(fs)._request.__wrapped__  # the method without gcsfs's retry_request
    assert fs._request.__func__ is plain
    started = time.perf_counter()
    with pytest.raises(Exception, match="Cannot connect"):
        fs.info("bucket/object")  # refused: gcsfs would sleep at least 1 s, then try again
    assert time.perf_counter() - started < 1
    assert "_request" not in vars(gcsfs.GCSFileSystem(**options, skip_instance_cache=True))
    mine = Store("gs", {**options, "retries": 3}).fs  # the user's choice: gcsfs's loop, 3 tries
    assert mine._request.__func__.__wrapped__ is plain


def test_az_store_makes_one_attempt_and_leaves_other_adlfs_filesystems_alone() -> None:
    adlfs = pytest.importorskip("adlfs")
    conn = ("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
            f"AccountKey={servers.AZURE_KEY};BlobEndpoint=http://127.0.0.1:9/devstoreaccount1;")

    def policy(fs: Any) -> Any:
        return fs.service_client._config.retry_policy

    assert policy(Store("az", {"connection_string": conn}).fs).total_retries == 0
    theirs = adlfs.AzureBlobFileSystem(connection_string=conn, skip_instance_cache=True)
    assert policy(theirs).total_retries == 3  # the SDK's default, untouched
    mine = Store("az", {"connection_string": conn, "retries": 4}).fs
    assert policy(mine).total_retries == 3  # the user's choice: 4 attempts in all


def test_coalesce_merges_near_ranges_and_splits_big_ones() -> None:
    assert coalesce([(100, 10), (0, 10), (15, 5)], hole=10, part=1000) == [(0, 20), (100, 10)]
    pieces = coalesce([(0, 2500)], hole=0, part=1000)
    assert pieces == [(0, 834), (834, 834), (1668, 832)]
    assert sum(n for _, n in pieces) == 2500
    assert coalesce([(5, 0)], hole=0, part=1000) == []  # nothing to fetch


def test_limiter_halves_on_throttle_and_creeps_back() -> None:
    limiter = Limiter(maximum=16)
    start = limiter.limit
    limiter.throttled()
    assert limiter.limit == start // 2
    for _ in range(100):
        limiter.succeeded()
    assert start // 2 < limiter.limit <= 16


class _Flaky:
    """A filesystem whose reads fail ``failures`` times (503) before answering."""

    protocol = "flaky"

    def __init__(self, data: bytes, failures: int, status: int = 503) -> None:
        self.data, self.failures, self.status, self.calls = data, failures, status, 0
        self.lock = threading.Lock()

    def cat_file(self, path: str, start: int, end: int) -> bytes:
        with self.lock:
            self.calls += 1
            if self.failures > 0:
                self.failures -= 1
                raise _Status(self.status)
        return self.data[start:end]

    def unstrip_protocol(self, path: str) -> str:
        return f"flaky://{path}"


def test_store_retries_throttling_and_counts_it() -> None:
    fs = _Flaky(bytes(range(256)) * 4, failures=3)
    store = Store("flaky", filesystem=fs, retry=RetryPolicy(base_delay_s=0.001))
    assert store.read("obj", 10, 20) == (bytes(range(256)) * 4)[10:30]
    stats = store.stats.as_dict()
    assert stats["retries"] == 3 and stats["throttled"] == 3 and stats["requests"] == 1


def test_store_gives_up_with_the_url_and_the_count() -> None:
    store = Store("flaky", filesystem=_Flaky(b"x" * 10, failures=100),
                  retry=RetryPolicy(attempts=3, base_delay_s=0.001))
    with pytest.raises(pqloader.RemoteIOError, match=r"flaky://obj: gave up after 3 attempts"):
        store.read("obj", 0, 5)


def test_store_does_not_retry_a_403() -> None:
    fs = _Flaky(b"x" * 10, failures=1, status=403)
    store = Store("flaky", filesystem=fs, retry=RetryPolicy(base_delay_s=0.001))
    with pytest.raises(pqloader.RemoteIOError, match="flaky://obj"):
        store.read("obj", 0, 5)
    assert fs.calls == 1


def test_store_retries_a_request_past_its_timeout() -> None:
    class Slow(_Flaky):
        def cat_file(self, path: str, start: int, end: int) -> bytes:
            with self.lock:
                self.calls += 1
                first = self.calls == 1
            if first:
                threading.Event().wait(2)  # the first request hangs
            return self.data[start:end]

    store = Store("flaky", filesystem=Slow(b"abcdef", 0),
                  retry=RetryPolicy(timeout_s=0.2, base_delay_s=0.001))
    assert store.read("obj", 1, 3) == b"bcd"
    assert store.stats.as_dict()["timeouts"] == 1


# -- the cache --------------------------------------------------------------------------------
def test_cache_round_trip_and_versions(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    cache.put("s3://b/k", "etag=1", 0, 5, b"hello")
    assert bytes(cache.get("s3://b/k", "etag=1", 0, 5)) == b"hello"
    assert cache.get("s3://b/k", "etag=2", 0, 5) is None  # a changed object: a new entry
    assert cache.get("s3://b/k", "etag=1", 0, 4) is None


def test_cache_paths_never_leave_the_directory(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c")
    cache.put("../../../../etc/passwd", "../..", 0, 1, b"x")
    cache.put("s3://b/" + "../" * 20 + "x", None, 0, 1, b"y")
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written and all((tmp_path / "c") in p.parents for p in written)


def test_corrupt_entry_is_detected_and_deleted(tmp_path: Path) -> None:
    from pqloader._cache import CorruptCacheEntry

    cache = Cache(tmp_path)
    cache.put("u", "v", 0, 1000, os.urandom(1000))
    [entry] = cache.entries()
    raw = bytearray(entry.path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    entry.path.write_bytes(bytes(raw))
    with pytest.raises(CorruptCacheEntry, match="damaged"):
        cache.get("u", "v", 0, 1000)
    assert cache.get("u", "v", 0, 1000) is None  # deleted: fetched again next time


def test_cache_evicts_least_recently_used(tmp_path: Path) -> None:
    cache = Cache(tmp_path, max_bytes=10_000)
    for i in range(5):
        cache.put("u", None, i * 3000, 3000, bytes(3000))
        path = cache.entries()[-1].path
        os.utime(path, (1_000_000 + i, 1_000_000 + i))  # distinct ages
    assert cache.usage() <= 10_000
    kept = {e.offset for e in cache.entries()}
    assert kept == {6000, 9000, 12000}  # the newest; the oldest went first
    assert cache.clear() > 0 and cache.usage() == 0


def test_old_layouts_are_shown_and_cleared(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from pqloader._cli import main as cli

    cache = Cache(tmp_path)
    cache.put("u", None, 0, 100, bytes(100))
    v1 = tmp_path / "v1" / "ab"  # what pqloader before layout v2 left
    v1.mkdir(parents=True)
    (v1 / f"ab{'0' * 62}.pqc").write_bytes(bytes(5000))
    assert cache.old_layouts() == {"v1": 5000}
    assert len(cache.entries()) == 1  # entries() is this layout's
    assert cli(["cache", "du", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["old_layouts"] == {"v1": 5000}
    assert cli(["cache", "ls", str(tmp_path)]) == 0
    assert "other pqloader versions' layouts (v1)" in capsys.readouterr().out
    assert cache.clear() >= 5100
    assert not (tmp_path / "v1").exists() and cache.usage() == 0 and cache.old_layouts() == {}


def test_concurrent_writers_never_expose_partial_entries(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    data = os.urandom(1 << 20)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                cache.put("u", "v", 0, len(data), data)
                got = cache.get("u", "v", 0, len(data))
                assert got is None or bytes(got) == data
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert not list(tmp_path.rglob(".tmp-*"))



def test_cache_entries_are_written_in_pieces_and_read_memory_mapped(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    data = os.urandom(100_000)
    cache.put("s3://b/k", "etag=1", 7, len(data), [data[:30_000], data[30_000:]])
    got = cache.get("s3://b/k", "etag=1", 7, len(data))
    assert isinstance(got, pa.Buffer) and got.to_pybytes() == data
    [entry] = cache.entries()
    assert (entry.offset, entry.length) == (7, len(data))
    maps = Path("/proc/self/maps")
    if maps.exists():  # mapped from the entry's file, not read into memory
        assert os.path.realpath(entry.path) in maps.read_text()
    with pytest.raises(ValueError, match="got 3 bytes"):
        cache.put("s3://b/k", "etag=1", 0, 4, b"abc")


def test_a_corrupt_entry_is_counted_refetched_and_cached_again(tmp_path: Path) -> None:
    from pqloader._fetch import cached_ranges

    data = os.urandom(5000)
    fs = _Flaky(data, failures=0)
    store = Store("flaky", filesystem=fs)
    cache = Cache(tmp_path)
    r = (100, 3000)
    assert bytes(cached_ranges(store, cache, "obj", "v1", [r])[r]) == data[100:3100]
    [entry] = cache.entries()
    raw = bytearray(entry.path.read_bytes())
    raw[-100] ^= 0x01  # one bit of the payload
    entry.path.write_bytes(bytes(raw))
    assert bytes(cached_ranges(store, cache, "obj", "v1", [r])[r]) == data[100:3100]
    assert bytes(cached_ranges(store, cache, "obj", "v1", [r])[r]) == data[100:3100]
    stats = store.stats.as_dict()
    assert fs.calls == 2 and stats["cache_corrupt"] == 1
    assert (stats["cache_hits"], stats["cache_misses"]) == (1, 2)

# -- memory:// end to end ---------------------------------------------------------------------
@pytest.fixture
def memory_dataset(tmp_path: Path) -> str:
    table = pa.table({"x": np.arange(20_000), "s": [str(i) for i in range(20_000)],
                      "tok": pa.array([[i] * (i % 4) for i in range(20_000)])})
    pqloader.write_dataset(table, tmp_path / "d", rows_per_file=6000, row_group_size=1500)
    fs = fsspec.filesystem("memory")
    root = f"/pq-{os.getpid()}-{tmp_path.name}"
    fs.put(str(tmp_path / "d"), root, recursive=True)
    return f"memory://{root}"


def test_memory_url_every_row_once_and_warm_cache_makes_no_requests(
        memory_dataset: str, tmp_path: Path) -> None:
    ds = pqloader.ParquetDataset(memory_dataset, columns=["x", "tok"], cache=tmp_path / "cache")
    assert ds.files[0].startswith("memory://")
    loader = pqloader.DataLoader(ds, batch_size=700, shuffle=True, num_workers=2)
    for epoch in range(2):
        loader.set_epoch(epoch)
        before = ds.io_stats()["requests"]
        xs, lengths = [], []
        for batch in loader:
            xs.append(batch["x"].numpy())
            lengths.append(batch["tok_lengths"].numpy())
        x = np.concatenate(xs)
        assert np.array_equal(np.sort(x), np.arange(20_000))
        assert np.array_equal(np.concatenate(lengths), x % 4)
        if epoch == 1:
            assert ds.io_stats()["requests"] == before  # every byte from the cache
    assert ds.io_stats()["cache_hits"] > 0


def test_memory_projection_fetches_only_the_projected_columns(memory_dataset: str) -> None:
    full = pqloader.ParquetDataset(memory_dataset)
    list(pqloader.DataLoader(full, batch_size=5000, num_workers=0))
    stored = sum(fsspec.filesystem("memory").du(memory_dataset, total=False).values())
    tails = len(full.files) * (64 << 10)  # each footer comes with its file's last 64 KiB
    assert full.io_stats()["bytes"] <= stored + tails  # no column chunk fetched twice
    one = pqloader.ParquetDataset(memory_dataset, columns=["x"])
    list(pqloader.DataLoader(one, batch_size=5000, num_workers=0))
    assert one.io_stats()["bytes"] - tails < (full.io_stats()["bytes"] - tails) / 2


def test_memory_map_style_and_glob(memory_dataset: str) -> None:
    ds = pqloader.ParquetDataset(memory_dataset + "/part-*.parquet")
    assert len(ds) == 20_000
    assert ds[12_345]["s"] == "12345"


def test_storage_options_for_a_local_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(pqloader.InvalidArgumentError, match="local path"):
        pqloader.ParquetDataset(tmp_path, storage_options={"anon": True})


def test_unknown_protocol_says_what_to_install() -> None:
    with pytest.raises(ImportError, match="fsspec"):
        pqloader.ParquetDataset("nosuchproto://bucket/data")


def _kinds(cache: Cache, sizes: dict[str, int]) -> dict[str, list[object]]:
    """The cache's entries by what they hold: a data file's footer (its last bytes), a row
    group, or another object (the manifest)."""
    out: dict[str, list[object]] = {"footer": [], "row group": [], "other": []}
    for e in cache.entries():
        kind = "other" if e.url not in sizes else (
            "footer" if e.offset + e.length == sizes[e.url] else "row group")
        out[kind].append(e)
    return out


def test_memory_one_cache_entry_per_row_group(memory_dataset: str, tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    ds = pqloader.ParquetDataset(memory_dataset, cache=cache)
    assert np.array_equal(np.sort(np.concatenate([b["x"].numpy() for b in pqloader.DataLoader(
        ds, batch_size=1000, shuffle=True)])), np.arange(20_000))
    fs = fsspec.filesystem("memory")
    sizes = {f: fs.size(f) for f in ds.files}
    kinds = _kinds(cache, sizes)
    assert len(kinds["footer"]) == len(ds.files)
    # a row group in the tail fetched with its file's footer is read from that tail's entry
    in_tails = 0
    for f in ds.files:
        md = pq.read_metadata(fs.open(f))
        in_tails += sum(min(c.dictionary_page_offset or c.data_page_offset, c.data_page_offset)
                        >= sizes[f] - tail_range(sizes[f])[1] for c in (
                            md.row_group(i).column(0) for i in range(md.num_row_groups)))
    assert 0 < in_tails < ds.num_row_groups
    assert len(kinds["row group"]) == ds.num_row_groups - in_tails
    assert [e.url.rsplit("/", 1)[-1] for e in kinds["other"]] == ["_pqloader_manifest.json"]


def test_memory_projection_caches_only_the_projected_columns(tmp_path: Path) -> None:
    # Columns of ~200 KB per row group: the gaps between projected ones exceed hole_bytes.
    rng = np.random.default_rng(0)
    n = 4000
    columns = {"id": np.arange(n)}
    for i in range(6):
        columns[f"pad{i}"] = pa.array([rng.bytes(200) for _ in range(n)], pa.binary())
    table = pa.table(columns)
    pqloader.write_dataset(table, tmp_path / "wide", rows_per_file=2000, row_group_size=1000)
    root = f"/pq-wide-{os.getpid()}-{tmp_path.name}"
    fsspec.filesystem("memory").put(str(tmp_path / "wide"), root, recursive=True)

    cache = Cache(tmp_path / "cache")
    ds = pqloader.ParquetDataset(f"memory://{root}", columns=["id", "pad3"], cache=cache)
    for epoch in range(2):  # the second from the cache
        before = ds.io_stats()["requests"]
        got = {}
        for batch in pqloader.DataLoader(ds, batch_size=300, shuffle=True, seed=epoch):
            got.update(zip(batch["id"].numpy().tolist(), batch["pad3"], strict=True))
        assert sorted(got) == list(range(n))
        assert all(got[i] == table["pad3"][i].as_py() for i in range(n))
        if epoch == 1:
            assert ds.io_stats()["requests"] == before

    import pyarrow.parquet as pq

    fs = fsspec.filesystem("memory")
    sizes = {f: fs.size(f) for f in ds.files}
    projected = 0
    for f in ds.files:
        with fs.open(f) as handle:
            md = pq.read_metadata(handle)
        for g in range(md.num_row_groups):
            projected += sum(md.row_group(g).column(c).total_compressed_size for c in (0, 4))
    data = _kinds(cache, sizes)["row group"]
    assert len(data) == 2 * ds.num_row_groups  # id and pad3 apart: two ranges, no gap
    assert sum(e.length for e in data) == projected


def test_a_read_across_a_gap_between_known_ranges_fetches_the_gap_alone() -> None:
    from pqloader._rangefile import RangeFile

    data = bytes(range(50))
    asked: list[tuple[int, int]] = []

    def fetch(offset: int, length: int) -> bytes:
        asked.append((offset, length))
        return data[offset:offset + length]

    f = RangeFile(50, {(0, 10): data[0:10], (20, 10): data[20:30]}, fetch)
    f.seek(5)
    assert bytes(f.read(30)) == data[5:35] and asked == [(10, 10), (30, 5)]
    asked.clear()
    f.seek(0)
    assert bytes(f.read(30)) == data[0:30] and asked == [(10, 10)]  # (a gap, then known)
    asked.clear()
    f.seek(22)
    assert bytes(f.read(5)) == data[22:27] and asked == []
    f.seek(40)
    assert bytes(f.read()) == data[40:] and asked == [(40, 10)]


def test_a_projection_with_small_gaps_is_fetched_once_and_cached_whole(
        tmp_path: Path, nginx_files: Any) -> None:
    """pyarrow pre-buffers a row group's chunks joined across gaps up to 8 KiB: with
    hole_bytes=0, spans apart by a small column's chunk made it read that gap, and each such
    read fetched the whole row group again, on a warm cache too (found by fuzzing)."""
    def write(name: str, rows: int) -> None:
        t = pa.table({"a": np.arange(rows), "b": np.zeros(rows, np.int8),
                      "c": np.arange(rows) * 2.0})
        pq.write_table(t, tmp_path / name, row_group_size=rows, use_dictionary=["b"],
                       compression="none")
        os.utime(tmp_path / name, (time.time() - 3600,) * 2)  # (not modified lately)

    write("big.parquet", 50_000)  # its row group before the tail fetched with the footer
    write("small.parquet", 1_000)  # all in the tail
    retry = RetryPolicy(hole_bytes=0)
    nginx = nginx_files(tmp_path)

    def data_bytes(url: str, columns: list[str] | None, cache: Cache | None) -> int:
        ds = pqloader.ParquetDataset(url, columns=columns, cache=cache, retry=retry)
        opened = len(nginx.settled_requests())  # (the footer's request, or none: cached)
        loader = pqloader.DataLoader(ds, batch_size=4096, num_workers=0)  # (workers: each
        assert sum(len(b["a"]) for b in loader) == len(ds)  # fetches a row group it shares)
        return sum(r.bytes_sent for r in nginx.settled_requests()[opened:]
                   if r.method == "GET")

    size = (tmp_path / "big.parquet").stat().st_size  # columns a and c: ~800 of ~850 KB
    assert 0 < data_bytes(f"{nginx.url}/big.parquet", ["a", "c"], None) < size  # was 2x
    cache = Cache(tmp_path / "cache")
    data_bytes(f"{nginx.url}/small.parquet", None, cache)
    assert data_bytes(f"{nginx.url}/small.parquet", ["a", "c"], cache) == 0  # a warm cache


def test_listing_a_server_that_stopped_answering_gives_up_per_the_policy(
        tmp_path: Path, nginx_files: Any) -> None:
    """An HTTP folder's listing waited on a silent server for aiohttp's own 5 min a request,
    whatever the policy's timeout_s: the policy's attempts times that (found by fuzzing)."""
    pqloader.write_dataset(pa.table({"id": list(range(100))}), tmp_path / "ds")
    nginx = nginx_files(tmp_path / "ds")
    retry = RetryPolicy(attempts=2, timeout_s=1, max_delay_s=0.1)
    with nginx.frozen(), pytest.raises(pqloader.RemoteIOError,
                                       match=r"gave up after 2 attempts.*no answer in 1 s"):
        pqloader.ParquetDataset(nginx.url + "/", retry=retry)
