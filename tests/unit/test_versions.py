"""A remote object's version, and the objects modified too lately to cache (``_versions.py``)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from email.utils import formatdate
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from pqloader._backends import _strong_etag
from pqloader._versions import cacheable, same_version, version_of


def test_a_version_modified_within_the_last_seconds_is_not_cacheable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    old = {"ETag": '"5f-10"', "Last-Modified": formatdate(now - 60, usegmt=True)}
    new = {"ETag": '"5f-10"', "Last-Modified": formatdate(now, usegmt=True)}
    assert version_of(old, 16) == 'ETag="5f-10";size=16' and cacheable(version_of(old, 16))
    racy = version_of(new, 16)
    assert racy is not None and not cacheable(racy)
    assert same_version(racy, version_of(old, 16))  # the same object, told at two times
    assert not same_version(racy, 'ETag="60-10";size=16') and not same_version(racy, None)
    assert same_version(None, None) and not cacheable(None)
    assert _strong_etag(racy) == '"5f-10"'  # still asked for by If-Match
    asctime = time.strftime("%a %b %d %H:%M:%S %Y", time.gmtime(now))  # GMT, zone unnamed
    for zone in ("Asia/Tokyo", "America/New_York", "UTC"):  # was read as local time
        monkeypatch.setenv("TZ", zone)
        time.tzset()
        assert not cacheable(version_of({"ETag": '"1a-2b"', "Last-Modified": asctime}, 1))
        assert cacheable(version_of({"ETag": '"1a-2b"', "Last-Modified": time.strftime(
            "%a %b %d %H:%M:%S %Y", time.gmtime(now - 60))}, 1))
    monkeypatch.undo()  # (TZ as it was, then read again)
    time.tzset()
    ahead = {"Last-Modified": formatdate(now + 3600, usegmt=True)}  # a server clock ahead
    assert not cacheable(version_of(ahead, 16))
    for odd in ("yesterday", "", None, 12):  # a date that does not parse: the ETag alone
        assert cacheable(version_of({"ETag": "x", "Last-Modified": odd}, 1))
    assert cacheable(version_of({"ETag": "x", "LastModified": "now"}, 1))  # (not HTTP's)
    lately = formatdate(now, usegmt=True)
    for digest in ('"d41d8cd98f00b204e9800998ecf8427e"', '"d41d8cd98f00b204e9800998ecf8427e-3"',
                   'W/"d41d8cd98f00b204e9800998ecf8427e"'):  # S3's MD5s: of the content
        assert cacheable(version_of({"ETag": digest, "Last-Modified": lately}, 1))
    for timed in ('"1a2b3c"', "0x8DC2B6A4E1F2C3D", "W/\"1a-2b\""):  # nginx's, Azure's...
        assert not cacheable(version_of({"ETag": timed, "Last-Modified": lately}, 1))
    assert not cacheable(version_of({"Last-Modified": lately}, 1))  # http.server's alone
    assert cacheable(version_of({"Content-MD5": "abc", "Last-Modified": lately}, 1))


def _same_size_files(folder: Path) -> Path:
    """``a.parquet`` of 0..1999, and ``b.parquet`` of 0.5..1999.5, of the very same size."""
    folder.mkdir()
    a = pa.table({"x": np.arange(2000, dtype=np.float64)})
    b = pa.table({"x": np.arange(2000, dtype=np.float64) + 0.5})
    path = folder / "a.parquet"
    pq.write_table(a, path, compression="none", use_dictionary=False)
    size = path.stat().st_size
    pq.write_table(b, folder / "b.parquet", compression="none", use_dictionary=False)
    assert (folder / "b.parquet").stat().st_size == size
    return path


def test_a_same_size_rewrite_within_the_second_is_not_served_stale_from_the_cache(
        tmp_path: Path, http_server: Callable[[Path], str]) -> None:
    """nginx's ETag is the whole-second mtime and the size: such a rewrite keeps it. Before,
    the first opening cached the file and every later one read the old rows from the cache."""
    path = _same_size_files(tmp_path / "d")
    base = http_server(tmp_path / "d")
    now = int(time.time())
    os.utime(path, (now, now))
    cache = pqloader.Cache(tmp_path / "cache")
    first = pqloader.ParquetDataset(f"{base}/a.parquet", cache=cache)
    assert [first[i]["x"] for i in (0, 1999)] == [0.0, 1999.0]
    assert not list(cache.entries()), "an object modified this second was cached"
    os.replace(tmp_path / "d" / "b.parquet", path)
    os.utime(path, (now, now))  # the same second, the same size: the same ETag
    second = pqloader.ParquetDataset(f"{base}/a.parquet", cache=cache)
    assert [second[i]["x"] for i in (0, 1999)] == [0.5, 1999.5]


def test_an_object_modified_long_ago_is_cached(
        tmp_path: Path, http_server: Callable[[Path], str]) -> None:
    path = _same_size_files(tmp_path / "d")
    base = http_server(tmp_path / "d")
    os.utime(path, (time.time() - 3600,) * 2)
    cache = pqloader.Cache(tmp_path / "cache")
    for _ in range(2):
        ds = pqloader.ParquetDataset(f"{base}/a.parquet", cache=cache)
        assert ds[1999]["x"] == 1999.0
    assert list(cache.entries()) and ds.io_stats()["cache_hits"] > 0
