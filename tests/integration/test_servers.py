"""The loopback servers of tests/servers.py do what the remote-IO tests rely on, checked on data."""

from __future__ import annotations

import http.client
import multiprocessing
import statistics
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pyarrow.parquet as pq
import pytest
import s3fs
import servers

ROWS = 1000
MakeDataset = Callable[..., Path]


def _s3fs(storage_options: dict[str, Any]) -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(**storage_options, skip_instance_cache=True)


def _ids(fs: Any, files: list[str]) -> list[int]:
    """Every ``id`` in ``files``, read with pyarrow through ``fs``, sorted."""
    return sorted(i for f in files for i in pq.read_table(f, filesystem=fs)["id"].to_pylist())


def _parquet(fs: Any, url: str) -> list[str]:
    return sorted(f for f in fs.find(url) if f.endswith(".parquet"))


def _fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int | str, bytes]:
    """One plain HTTP GET on a fresh connection: (status or exception name, body)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                    timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (http.client.RemoteDisconnected, ConnectionError) as exc:
        return type(exc).__name__, b""


def _presigned_get(server: servers.S3Server, url: str, key: str) -> str:
    bucket = url.removeprefix("s3://").split("/", 1)[0]
    return str(server.client().generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}))


def test_s3_upload_list_read_back(s3_server: servers.S3Server,
                                  make_dataset: MakeDataset) -> None:
    local = make_dataset(ROWS, rows_per_file=300, row_group_size=100)
    url = s3_server.upload_dir(local, prefix="train")
    fs = _s3fs(s3_server.storage_options)

    listed = {p.rsplit("/", 1)[1] for p in fs.ls(url)}
    assert listed == {p.name for p in local.iterdir()}
    files = _parquet(fs, url)
    assert _ids(fs, files) == list(range(ROWS))
    # Parquet readers start with a suffix range (footer length + "PAR1"): it must be right.
    first = local / files[0].rsplit("/", 1)[1]
    assert fs.cat_file(files[0], start=-8) == first.read_bytes()[-8:]
    assert fs.cat_file(files[0], start=4, end=20) == first.read_bytes()[4:20]
    assert fs.info(files[0])["size"] == first.stat().st_size


def _read_in_child(args: tuple[dict[str, Any], list[str]]) -> list[int]:
    fs = s3fs.S3FileSystem(**args[0], skip_instance_cache=True)  # built after fork, never before
    return _ids(fs, args[1])


def test_moto_serves_forked_readers(moto_s3: servers.MotoS3, make_dataset: MakeDataset) -> None:
    url = moto_s3.upload_dir(make_dataset(ROWS, rows_per_file=250))
    files = _parquet(_s3fs(moto_s3.storage_options), url)
    with multiprocessing.get_context("fork").Pool(2) as pool:
        parts = pool.map(_read_in_child, [(moto_s3.storage_options, files[i::4])
                                          for i in range(4)])
    assert sorted(i for part in parts for i in part) == list(range(ROWS))


def test_http_ranges_and_listing(http_server: Any, make_dataset: MakeDataset) -> None:
    local = make_dataset(ROWS, rows_per_file=400)
    base_url = http_server(local)
    fs = fsspec.filesystem("http", skip_instance_cache=True)

    listed = {u.rstrip("/").rsplit("/", 1)[1] for u in fs.ls(f"{base_url}/", detail=False)}
    assert listed == {p.name for p in local.iterdir()}
    name = sorted(p.name for p in local.glob("*.parquet"))[0]
    data = (local / name).read_bytes()
    assert fs.info(f"{base_url}/{name}")["size"] == len(data)
    assert fs.cat_file(f"{base_url}/{name}", start=100, end=300) == data[100:300]
    # A real range request: 206 and only the bytes asked for, as nginx logged them.
    status, body = _fetch(f"{base_url}/{name}", {"Range": "bytes=-8"})
    assert (status, body) == (206, data[-8:])
    files = sorted(f"{base_url}/{p.name}" for p in local.glob("*.parquet"))
    assert _ids(fs, files) == list(range(ROWS))


def test_throttle_answers_slowdown_and_s3fs_retries_through(
        s3_proxy: Any, make_dataset: MakeDataset) -> None:
    proxy = s3_proxy(rate_per_s=10, burst=3)
    local = make_dataset(ROWS, rows_per_file=500)
    url = proxy.upload_dir(local)
    name = sorted(p.name for p in local.glob("*.parquet"))[0]
    get = _presigned_get(proxy, url, name)

    replies = [_fetch(get) for _ in range(40)]  # a burst, far above 10/s + 3
    statuses = Counter(status for status, _ in replies)
    print(f"burst of 40 at 10 r/s + 3: {dict(statuses)}")
    assert statuses[503] >= 20 and statuses[200] >= 3
    assert set(statuses) == {200, 503}
    assert all(b"<Code>SlowDown</Code>" in body for status, body in replies if status == 503)
    assert all(body == (local / name).read_bytes() for status, body in replies if status == 200)

    before = len(proxy.settled_requests())
    fs = _s3fs(proxy.storage_options)
    assert _ids(fs, _parquet(fs, url)) == list(range(ROWS))
    during = Counter(r.status for r in proxy.settled_requests()[before:])
    print(f"s3fs through the throttle: {dict(during)}")
    assert during[503] >= 1  # it was throttled, and retried to the exact data


def _median_s(call: Any, n: int = 15) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def test_latency_proxy_adds_latency(s3_proxy: Any, moto_s3: servers.MotoS3,
                                    make_dataset: MakeDataset) -> None:
    latency_s = 0.05
    proxy = s3_proxy(latency_ms=latency_s * 1000)
    local = make_dataset(100, rows_per_file=100)
    url = proxy.upload_dir(local)
    bucket = url.removeprefix("s3://").strip("/")
    name = next(local.glob("*.parquet")).name
    direct, slowed = moto_s3.client(), proxy.client()
    for client in (direct, slowed):  # connect first: time requests, not handshakes
        client.head_object(Bucket=bucket, Key=name)

    direct_s = _median_s(lambda: direct.get_object(Bucket=bucket, Key=name)["Body"].read())
    slowed_s = _median_s(lambda: slowed.get_object(Bucket=bucket, Key=name)["Body"].read())
    print(f"GET median: direct {direct_s * 1000:.1f} ms, through {latency_s * 1000:.0f} ms "
          f"latency proxy {slowed_s * 1000:.1f} ms (+{(slowed_s - direct_s) * 1000:.1f} ms)")
    assert slowed_s >= 0.9 * latency_s  # a floor only: never assert how fast a shared box is
    body = slowed.get_object(Bucket=bucket, Key=name)["Body"].read()
    assert body == (local / name).read_bytes()


def test_drop_proxy_closes_connections(s3_proxy: Any, make_dataset: MakeDataset) -> None:
    proxy = s3_proxy(drop_fraction=0.5)
    local = make_dataset(ROWS, rows_per_file=250)
    url = proxy.upload_dir(local)
    name = sorted(p.name for p in local.glob("*.parquet"))[0]
    get = _presigned_get(proxy, url, name)

    replies = [_fetch(get) for _ in range(40)]
    ok = [body for status, body in replies if status == 200]
    dropped = [status for status, _ in replies if status != 200]
    print(f"40 GETs, half dropped on average: {len(ok)} answered, {Counter(dropped)}")
    assert len(ok) >= 5 and len(dropped) >= 5  # P(fewer than 5 of 40) < 1e-6 for either
    assert set(dropped) <= {"RemoteDisconnected", "ConnectionResetError"}
    assert all(body == (local / name).read_bytes() for body in ok)
    assert Counter(r.status for r in proxy.settled_requests())[444] == len(dropped)

    flaky = s3_proxy(drop_fraction=0.2)
    fs = _s3fs(flaky.storage_options)
    assert _ids(fs, _parquet(fs, url)) == list(range(ROWS))
    print(f"s3fs through 20% drops: {dict(Counter(r.status for r in flaky.requests()))}")


def test_proxy_passes_signed_requests(s3_server: servers.S3Server, s3_proxy: Any) -> None:
    """The proxy keeps the client's Host header, so RGW's signature checks pass through it."""
    proxy = s3_proxy(upstream=s3_server, latency_ms=1)
    bucket = proxy.create_bucket()
    fs = _s3fs(proxy.storage_options)
    fs.pipe(f"{bucket}/dir/a.bin", b"0123456789")
    assert fs.cat(f"{bucket}/dir/a.bin") == b"0123456789"
    assert fs.cat_file(f"{bucket}/dir/a.bin", start=-3) == b"789"
    assert fs.ls(f"{bucket}/dir", detail=False) == [f"{bucket}/dir/a.bin"]
    assert {r.method for r in proxy.settled_requests()} >= {"PUT", "GET"}


@pytest.mark.parametrize("faults", [{"drop_fraction": 1.0}, {"rate_per_s": 0},
                                    {"latency_ms": -1}])
def test_proxy_rejects_bad_faults(moto_s3: servers.MotoS3, faults: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(faults))):
        servers.S3FaultProxy(moto_s3, **faults)


def test_servers_leave_nothing_behind(s3_proxy: Any, moto_s3: servers.MotoS3,
                                      tmp_path: Path) -> None:
    s3_proxy()  # skips here where nginx is missing
    proxy = servers.S3FaultProxy(moto_s3, drop_fraction=0.1)
    files = servers.NginxFiles(tmp_path)
    procs = [p for p, _ in proxy._procs + files._procs]
    folders = [proxy.dir, files.dir]
    assert all(p.poll() is None for p in procs) and all(d.is_dir() for d in folders)
    proxy.close()
    files.close()
    assert all(p.poll() is not None for p in procs)
    assert not any(d.exists() for d in folders)
