"""Remote IO at its edges: errors in disguise, servers that ignore Range, objects with no ETag,
caches that cannot be written, shared by several jobs, or held across a fork."""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

import pqloader
from pqloader import _cache
from pqloader._cache import Cache, CorruptCacheEntry
from pqloader._cli import main as cli
from pqloader._fetch import cached_ranges
from pqloader._fs import Store, _object_info
from pqloader._retry import RangeIgnored, RetryPolicy, ShortRead, classify


class _Status(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def _raised_from(exc: BaseException, cause: BaseException) -> BaseException:
    try:
        raise exc from cause
    except BaseException as caught:
        return caught


class _Bytes:
    """A filesystem of one object whose reads can misbehave: answer whole (no Range), or
    raise what ``fail`` returns once."""

    protocol = "edge"

    def __init__(self, data: bytes, *, whole: bool = False,
                 fail: BaseException | None = None) -> None:
        self.data, self.whole, self.fail, self.calls = data, whole, fail, 0

    def cat_file(self, path: str, start: int, end: int) -> bytes:
        self.calls += 1
        if self.fail is not None:
            fail, self.fail = self.fail, None
            raise fail
        return self.data if self.whole else self.data[start:end]

    def unstrip_protocol(self, path: str) -> str:
        return f"edge://{path}"


def test_a_503_raised_as_file_not_found_is_retried_not_missing() -> None:
    # fsspec's HTTP info() raises FileNotFoundError(url) from the 503 or 429 it got
    assert classify(_raised_from(FileNotFoundError("http://h/a"), _Status(503))) == "throttled"
    assert classify(_raised_from(FileNotFoundError("http://h/a"), _Status(500))) == "transient"
    assert classify(_raised_from(FileNotFoundError("http://h/a"), _Status(404))) == "fatal"
    assert classify(FileNotFoundError("http://h/a")) == "fatal"


def test_a_refused_connection_wrapped_by_a_client_is_retried() -> None:
    """botocore's EndpointConnectionError and aiohttp's ClientConnectorError wrap the
    socket's ConnectionRefusedError: a server restarting for a second failed the read at once
    (found in review)."""
    import aiohttp
    from botocore.exceptions import EndpointConnectionError

    refused = ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 1)")
    s3 = _raised_from(EndpointConnectionError(endpoint_url="http://127.0.0.1:1/b/k"), refused)
    http = aiohttp.ClientConnectorError(
        aiohttp.client_reqrep.ConnectionKey("127.0.0.1", 1, False, True, None, None, None),
        refused)
    assert classify(s3) == "transient"
    assert classify(http) == "transient"
    assert classify(OSError(111, "refused")) == "transient"


def test_a_host_that_cannot_be_reached_is_said_so() -> None:
    """fsspec's HTTP told a refused connection or an unknown host as FileNotFoundError: "no
    such object"; after retries, the advice was to raise the attempts (found in review)."""
    from botocore.exceptions import EndpointConnectionError

    from pqloader._retry import remote_error

    policy = RetryPolicy(attempts=2, base_delay_s=0)
    with pytest.raises(pqloader.RemoteIOError, match=r"http://127\.0\.0\.1:1/x\.parquet: no "
                       r"connection was made \(ConnectionRefusedError: .*check the URL's host"):
        pqloader.ParquetDataset("http://127.0.0.1:1/x.parquet", retry=policy)
    with pytest.raises(pqloader.RemoteIOError, match=r"/d/: no connection was made"):
        pqloader.ParquetDataset("http://127.0.0.1:1/d/", retry=policy)  # (listed as empty)
    refused = _raised_from(EndpointConnectionError(endpoint_url="http://127.0.0.1:1/b/k"),
                           ConnectionRefusedError(111, "refused"))
    said = str(remote_error("s3://b/k", refused, 10, "transient"))
    assert "gave up after 10 attempts" in said and "no connection was made" in said
    assert "Raise RetryPolicy" not in said


def test_a_filesystem_that_cannot_be_made_names_storage_options(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """adlfs without an account raised a bare ValueError (found in review)."""
    pytest.importorskip("adlfs")
    for name in list(os.environ):
        if name.startswith("AZURE_STORAGE"):
            monkeypatch.delenv(name)
    with pytest.raises(pqloader.RemoteIOError, match=r"az://: its filesystem "
                       r"\(AzureBlobFileSystem\) could not be made: ValueError: .*check "
                       r"storage_options"):
        pqloader.ParquetDataset("az://bucket/train/")


def test_a_short_read_is_transient_whatever_its_byte_counts() -> None:
    assert classify(ShortRead("short read: 120 of 503 bytes")) == "transient"
    assert classify(RangeIgnored("asked for 503 bytes, got 4096")) == "fatal"


def test_a_server_that_ignores_range_fails_at_once_and_says_why() -> None:
    fs = _Bytes(bytes(1000), whole=True)
    store = Store("edge", filesystem=fs, retry=RetryPolicy(base_delay_s=0.001))
    with pytest.raises(pqloader.RemoteIOError, match=r"edge://obj: .*ignores HTTP Range"):
        store.read("obj", 10, 20)
    assert fs.calls == 1  # not retried: every attempt would download the whole object


def test_ctrl_c_during_a_request_is_not_an_io_error() -> None:
    store = Store("edge", filesystem=_Bytes(bytes(10), fail=KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        store.read("obj", 0, 5)


def test_an_object_known_by_last_modified_alone_has_a_version_with_its_size() -> None:
    info = {"name": "http://h/a.parquet", "size": 497,
            "Last-Modified": "Mon, 23 Nov 2026 03:36:04 GMT"}  # fsspec HTTP with no ETag
    version = _object_info(info).version
    assert version is not None and "03:36:04" in version and "497" in version
    assert _object_info({**info, "size": 498}).version != version
    assert _object_info({"name": "http://h/a.parquet", "size": 497}).version is None


def test_an_object_with_no_version_is_read_but_never_cached(tmp_path: Path) -> None:
    fs = _Bytes(bytes(range(100)))
    store = Store("edge", filesystem=fs)
    cache = Cache(tmp_path)
    for _ in range(2):
        got = cached_ranges(store, cache, "obj", None, [(0, 10)])
        assert bytes(got[(0, 10)]) == bytes(range(10))
    assert fs.calls == 2 and cache.entries() == []  # a rewrite could never be noticed


def test_an_arrow_filesystem_glob_stays_in_its_folder(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": [3, 4, 5]}), tmp_path / "old" / "b.parquet")
    fs = pafs.LocalFileSystem()
    assert len(pqloader.ParquetDataset(f"{tmp_path}/*.parquet", filesystem=fs)) == 2
    assert len(pqloader.ParquetDataset(f"{tmp_path}/**/*.parquet", filesystem=fs)) == 5
    (tmp_path / "old" / "_pqloader_incomplete").write_text("stopped")  # a write not finished
    with pytest.raises(pqloader.CorruptFileError, match="old: write_dataset did not finish"):
        pqloader.ParquetDataset(f"{tmp_path}/**/*.parquet", filesystem=fs)
    assert len(pqloader.ParquetDataset(f"{tmp_path}/*.parquet", filesystem=fs)) == 2


def test_an_object_replaced_by_a_shorter_one_is_told_at_once_where_no_version_is_asked(
        tmp_path: Path) -> None:
    """A filesystem that reads whatever is there now (``pyarrow.fs``, GCS, Azure): the short
    reads were retried 10 times as cut short, then told "raise RetryPolicy(attempts=...)"."""
    def write(n: int) -> None:
        ids = np.arange(n)
        pq.write_table(pa.table({"id": ids}), tmp_path / "a.parquet", row_group_size=20_000,
                       compression="none", use_dictionary=False)

    write(100_000)
    ds = pqloader.ParquetDataset(f"{tmp_path}/a.parquet", filesystem=pafs.LocalFileSystem(),
                                 retry=RetryPolicy(base_delay_s=0.01, max_delay_s=0.02))
    write(1_000)
    with pytest.raises(pqloader.RemoteIOError, match="replaced since the dataset was opened"):
        list(pqloader.DataLoader(ds, batch_size=5_000))
    assert ds.io_stats()["retries"] == 0


def test_a_cache_that_cannot_be_written_warns_once_and_reads_go_on(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_bytes(b"x")  # the cache's folder would have to live inside a file
    cache = Cache(blocker / "cache")
    store = Store("edge", filesystem=_Bytes(bytes(range(100))))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for start in (0, 10):
            got = cached_ranges(store, cache, "obj", "v", [(start, 10)])
            assert bytes(got[(start, 10)]) == bytes(range(start, start + 10))
    assert [str(w.message).count("cannot be written") for w in caught] == [1]


def test_an_entry_that_cannot_be_read_or_deleted_is_fetched_again(tmp_path: Path) -> None:
    """A shared cache another user or job filled (read-only to this one): an entry it cannot
    read nor delete, here a folder in the entry's place, is read past, not a failed read."""
    cache = Cache(tmp_path / "cache")
    store = Store("edge", filesystem=_Bytes(bytes(range(100))))
    cached_ranges(store, cache, "obj", "v", [(0, 10)])
    [entry] = cache.entries()
    entry.path.unlink()
    (entry.path / "inside").mkdir(parents=True)
    with pytest.raises(CorruptCacheEntry, match="damaged or unreadable; left in place"):
        cache.get(entry.url, "v", 0, 10)
    with pytest.warns(RuntimeWarning, match="cannot be written"):  # nor written again
        got = cached_ranges(store, cache, "obj", "v", [(0, 10)])
    assert bytes(got[(0, 10)]) == bytes(range(10))


@pytest.mark.parametrize("max_bytes", [0, 0.5, -1, float("nan"), float("inf"), True, "1GB"])
def test_cache_max_bytes_is_a_number_of_bytes(tmp_path: Path, max_bytes: Any) -> None:
    with pytest.raises(pqloader.InvalidArgumentError, match="max_bytes must be a number"):
        Cache(tmp_path, max_bytes=max_bytes)
    assert Cache(tmp_path, max_bytes=50e9).max_bytes == 50_000_000_000
    assert Cache(tmp_path, max_bytes=np.int64(10**9)).max_bytes == 10**9  # numpy's too


def test_max_bytes_holds_when_several_processes_share_the_cache(tmp_path: Path) -> None:
    # Each Cache stands for a job of its own: it counts its own writes, not the others'.
    jobs = [Cache(tmp_path, max_bytes=1_000_000) for _ in range(4)]
    for i in range(40):
        jobs[i % 4].put("u", "v", i * 50_000, 50_000, bytes(50_000))
    assert jobs[0].usage() <= 1_000_000 * 1.1


def test_a_child_forked_while_the_cache_lock_is_held_can_still_write(tmp_path: Path) -> None:
    cache = Cache(tmp_path, max_bytes=10**9)
    cache.put("u", "v", 0, 10, bytes(10))
    with cache._lock:  # another thread of the parent, mid-count, at the fork
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            timer = threading.Timer(20, os._exit, (3,))
            timer.daemon = True
            timer.start()
            cache.put("u", "v", 10, 10, bytes(10))
            os._exit(0 if cache.get("u", "v", 10, 10) is not None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_cache_deleted_by_hand_under_its_writers_is_no_error_of_theirs(tmp_path: Path) -> None:
    """``rm -rf`` of a cache while jobs write to it: a put is best effort (before, a scan of
    a folder just deleted raised FileNotFoundError, which a read told as its file gone)."""
    folder = tmp_path / "cache"
    cache = Cache(folder, max_bytes=20_000)  # small: every put counts the disk again
    stop = threading.Event()

    def wipe() -> None:
        while not stop.is_set():
            shutil.rmtree(folder, ignore_errors=True)

    wiper = threading.Thread(target=wipe)
    wiper.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # cannot be written: told once
            for i in range(3_000):
                cache.put("http://h/a.parquet", "v", i * 1_000, 1_000, bytes(1_000))
    finally:
        stop.set()
        wiper.join()


def test_cache_commands_read_past_a_damaged_entry_header(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = Cache(tmp_path)
    cache.put("http://h/a.parquet", "v", 0, 10, bytes(10))
    cache.put("http://h/b.parquet", "v", 0, 10, bytes(10))
    damaged = next(e for e in cache.entries() if e.url.endswith("a.parquet"))
    damaged.path.write_bytes(damaged.path.read_bytes().replace(b'"url"', b'"uql"', 1))
    assert [e.url for e in cache.entries()] == ["http://h/b.parquet"]
    assert cli(["cache", "ls", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "b.parquet" in out and "a.parquet" not in out
    assert cli(["cache", "du", str(tmp_path), "--json"]) == 0
    du = json.loads(capsys.readouterr().out)
    assert du["entries"] == 1 and du["bytes"] == cache.usage() and du["damaged_bytes"] > 0


def test_a_cache_that_cannot_evict_says_so_once_and_reads_go_on(tmp_path: Path) -> None:
    cache = Cache(tmp_path, max_bytes=5_000)
    cache.put("http://h/a", "v", 0, 1_000, bytes(1_000))
    (tmp_path / "v2" / ".lock").mkdir()  # eviction's lock file cannot be opened
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(1, 20):
            assert cache.put("http://h/a", "v", i * 1_000, 1_000, bytes(1_000))
    told = [str(w.message) for w in caught]
    assert len(told) == 1 and "cannot evict" in told[0] and "max_bytes=5000" in told[0]


def test_du_counts_entries_written_meanwhile_as_entries_not_damage(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set():
            cache.put("http://h/a", "v", i * 10_000, 10_000, bytes(10_000))
            i += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        surveys = [cache.survey() for _ in range(20)]
    finally:
        stop.set()
        writer.join()
    assert all(s.damaged_bytes == 0 and s.unreadable_bytes == 0 for s in surveys)
    assert all(s.bytes == sum(e.size_bytes for e in s.entries) for s in surveys)


def test_a_full_disk_makes_the_cache_evict_down_to_its_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache filled past this job's max_bytes (by a job with a larger one) until the disk
    is full: this job's puts all fail, so eviction, which ran after a put, never ran."""
    big = Cache(tmp_path)
    for i in range(10):
        big.put("http://h/a", "v", i * 20_000, 20_000, bytes(20_000))
    small = Cache(tmp_path, max_bytes=50_000)

    def full(*args: Any, **kwargs: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_cache, "write", full)  # the disk, full (a real one needs a mount)
    with pytest.warns(RuntimeWarning, match="cannot be written"):
        assert not small.put("http://h/b", "v", 0, 20_000, bytes(20_000))
    assert small.usage() <= 50_000


def test_cache_commands_on_a_missing_folder_make_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "typo"
    assert cli(["cache", "clear", str(missing)]) == 0
    assert "nothing to clear" in capsys.readouterr().out
    assert cli(["cache", "du", str(missing)]) == 1
    assert "no cache folder" in capsys.readouterr().err
    assert not missing.exists()


def test_clear_never_deletes_a_users_folder_that_merely_looks_like_a_layout(
        tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    cache.put("u", "v", 0, 100, bytes(100))
    mine = tmp_path / "v1" / "train"
    mine.mkdir(parents=True)
    (mine / "labels.csv").write_text("a,b\n")
    (tmp_path / "v4" / "ab").mkdir(parents=True)  # names a layout's, loosely (found in review)
    (tmp_path / "v4" / "ab" / "abstract.pqc").write_text("mine")
    (tmp_path / "v4" / "ab" / ".tmp-notes").write_text("mine")
    (tmp_path / "v3").mkdir()
    (tmp_path / "v3" / "notes.txt").write_text("keep me")
    assert cache.old_layouts() == {}
    cache.clear()
    assert (mine / "labels.csv").exists() and (tmp_path / "v3" / "notes.txt").exists()
    assert (tmp_path / "v4" / "ab" / "abstract.pqc").exists()
    assert cache.entries() == []


def test_clear_deletes_entries_alone_in_the_current_layout(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``clear`` of a folder that was no cache deleted ``v2/photos/holiday.pqc`` and old
    ``.tmp-*`` files of the user's (any ``*.pqc`` below ``v2/`` passed for an entry, and
    ``du`` called them damaged: found in review). Only ``ab/<sha256>.pqc`` are entries."""
    cache = Cache(tmp_path)
    cache.put("u", "v", 0, 100, bytes(100))
    (entry,) = tmp_path.rglob("*.pqc")
    theirs = [tmp_path / "v2" / "photos" / "holiday.pqc", tmp_path / "v2" / "ab" / "mine.pqc",
              entry.with_name("notes.pqc"), entry.with_name(".tmp-draft"),
              tmp_path / "v2" / "photos" / f".tmp-1-{'a' * 32}"]
    for path in theirs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("keep me")
        os.utime(path, (1, 1))  # old: temporaries of a day ago are swept
    assert [e.path for e in cache.entries()] == [entry]
    assert cli(["cache", "du", str(tmp_path)]) == 0
    assert "damaged" not in capsys.readouterr().out
    size = entry.stat().st_size
    assert cli(["cache", "clear", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"dir": str(tmp_path), "freed_bytes": size}
    assert not entry.exists() and all(p.read_text() == "keep me" for p in theirs)
    assert cli(["cache", "clear", str(tmp_path / "typo"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["freed_bytes"] == 0


def test_a_listing_may_take_longer_than_one_request(tmp_path: Path) -> None:
    class SlowList(_Bytes):
        def find(self, path: str, detail: bool = True, withdirs: bool = False) -> dict:
            self.calls += 1
            threading.Event().wait(0.5)  # many pages of a large prefix
            return {f"{path}/a": {"name": f"{path}/a", "size": 10, "ETag": "1"}}

    fs = SlowList(bytes(10))
    store = Store("edge", filesystem=fs, retry=RetryPolicy(timeout_s=0.1, list_timeout_s=5))
    assert [o.path for o in store.find("b")] == ["b/a"]
    assert fs.calls == 1  # not abandoned after one request's timeout


def _serve_cutting(root: Path, cuts: int, stall: threading.Event | None = None,
                   deny: threading.Event | None = None) -> tuple[Any, str]:
    """An HTTP server of ``root`` with Range, whose first ``cuts`` ranged GETs send half their
    body and close: the connection dropped mid-transfer, as a proxy or a throttled link does.
    Once ``stall`` is set, a ranged GET is never answered; once ``deny`` is, every request
    gets 403 (a signed URL expired)."""
    import re
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    left = [cuts]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, head: bool) -> None:
            if deny is not None and deny.is_set():
                self.send_response(403)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = (root / self.path.partition("?")[0].lstrip("/")).read_bytes()
            match = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            body = data
            if match and not head:
                a = int(match[1])
                b = int(match[2]) if match[2] else len(data) - 1
                body = data[a:b + 1]
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {a}-{a + len(body) - 1}/{len(data)}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", f'"{len(data)}"')
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if head:
                return
            if match and stall is not None and stall.is_set():
                threading.Event().wait(300)  # a store that stopped answering
                return
            if match and left[0] > 0:
                left[0] -= 1
                body = body[:len(body) // 2]
                self.close_connection = True
            self.wfile.write(body)

        def do_HEAD(self) -> None:
            self._send(head=True)

        def do_GET(self) -> None:
            self._send(head=False)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_a_body_cut_short_mid_transfer_is_retried(tmp_path: Path) -> None:
    """aiohttp's error for it carries ``code=400`` (its parser's), which was taken for the
    server's status: a fatal "bad request", no retry, and the read failed."""
    pytest.importorskip("aiohttp")
    pq.write_table(pa.table({"id": np.arange(1000)}), tmp_path / "a.parquet", row_group_size=250)
    server, base = _serve_cutting(tmp_path, cuts=2)
    try:
        retry = RetryPolicy(attempts=5, base_delay_s=0.01, max_delay_s=0.02)
        ds = pqloader.ParquetDataset(f"{base}/a.parquet", retry=retry)
        loader = pqloader.DataLoader(ds, batch_size=100, shuffle=True, seed=0)
        ids = np.concatenate([b["id"].numpy() for b in loader])
        assert sorted(ids.tolist()) == list(range(1000))
        assert ds.io_stats()["retries"] >= 1
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("num_workers", ["0", "2"])
def test_ctrl_c_while_reads_stall_exits_at_once(tmp_path: Path, num_workers: str) -> None:
    """The IO pool's threads went on retrying the stalled reads, and the interpreter waits
    for them at exit: attempts x timeout (found in review: 20 s for 4 x 5 s; ~10 minutes
    with the default policy)."""
    import signal
    import subprocess
    import sys
    import time

    pytest.importorskip("aiohttp")
    pq.write_table(pa.table({"id": np.arange(200_000)}), tmp_path / "a.parquet",
                   row_group_size=50_000)  # row groups past the footer's 64 KiB tail
    stall = threading.Event()
    server, base = _serve_cutting(tmp_path, cuts=0, stall=stall)
    script = tmp_path / "read.py"
    script.write_text(  # SIGINT as a terminal sends it (a shell's background job ignores it)
        "import signal, sys, pqloader\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "retry = pqloader.RetryPolicy(timeout_s=5, attempts=4)\n"
        "ds = pqloader.ParquetDataset(sys.argv[1], retry=retry)\n"
        "print('opened', flush=True)\n"
        "sys.stdin.readline()\n"
        "print('reading', flush=True)\n"
        "for _ in pqloader.DataLoader(ds, batch_size=100, num_workers=int(sys.argv[2])):\n"
        "    pass\n")
    child = subprocess.Popen([sys.executable, str(script), f"{base}/a.parquet", num_workers],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "opened\n"
        stall.set()
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline() == "reading\n"
        time.sleep(1.5)  # the reads under way, stalled
        began = time.monotonic()
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=120)
        assert "KeyboardInterrupt" in err, err
        assert time.monotonic() - began < 10  # not 4 attempts x 5 s
    finally:
        child.kill()
        server.shutdown()
        server.server_close()


def test_http_403_is_access_denied_with_the_signed_url_hint_not_a_missing_object(
        tmp_path: Path) -> None:
    """fsspec raises an HTTP 403 as FileNotFoundError when it opens a file, and as aiohttp's
    error mid-read: "no such object", and never the hint for an expired signed URL."""
    pytest.importorskip("aiohttp")
    pq.write_table(pa.table({"id": np.arange(100_000)}), tmp_path / "a.parquet",
                   row_group_size=25_000)
    deny = threading.Event()
    server, base = _serve_cutting(tmp_path, cuts=0, deny=deny)
    signed = f"{base}/a.parquet?X-Amz-Signature=abc123&X-Amz-Credential=AKIA"
    try:
        ds = pqloader.ParquetDataset([signed])
        deny.set()  # expired after the open: mid-read
        with pytest.raises(pqloader.RemoteIOError, match=r"Credential=REDACTED: access denied "
                           r"\(403, message='Forbidden'.*a signed URL may have expired") as read:
            list(pqloader.DataLoader(ds, batch_size=1000))
        with pytest.raises(pqloader.RemoteIOError, match=r"access denied .*may have expired"):
            pqloader.ParquetDataset([signed])  # at the open
        assert "abc123" not in str(read.value) and "AKIA" not in str(read.value)
    finally:
        server.shutdown()
        server.server_close()


def test_a_user_and_password_in_a_url_are_secrets(tmp_path: Path) -> None:
    """Kept in cache entries (readable by all on a shared disk) and printed in errors."""
    from pqloader._signed import has_secret, is_signed, redact, unsigned

    url = "https://alice:TOPSECRET@host.example/data/a.parquet?v=1"
    assert unsigned(url) == "https://host.example/data/a.parquet?v=1"
    assert redact(f"failed: {url}") == "failed: https://REDACTED@host.example/data/a.parquet?v=1"
    assert has_secret(url) and not is_signed(url)
    assert unsigned("s3://bucket/user@example.com/a.parquet").endswith("user@example.com/a.parquet")
    cache = Cache(tmp_path)
    cache.put(url, "v1", 0, 3, b"abc")
    assert [e.url for e in cache.entries()] == ["https://host.example/data/a.parquet?v=1"]
    assert all(b"TOPSECRET" not in p.read_bytes() for p in tmp_path.rglob("*.pqc"))


def test_a_signature_redacted_leaves_the_message_around_it() -> None:
    from pqloader._signed import redact

    assert redact("(https://h/a?sig=abc%2Bdef): gone") == "(https://h/a?sig=REDACTED): gone"


def test_a_cache_folder_under_the_home_folder(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert Cache("~/pqcache").directory == tmp_path / "pqcache"  # not a folder named "~"


@pytest.mark.parametrize("name", ["base_delay_s", "max_delay_s", "timeout_s", "list_timeout_s",
                                  "hole_bytes"])
@pytest.mark.parametrize("value", [-1, float("nan")])
def test_retry_policy_refuses_negative_delays_and_timeouts(name: str, value: float) -> None:
    with pytest.raises(pqloader.InvalidArgumentError, match=f"RetryPolicy {name} must be >= 0"):
        RetryPolicy(**{name: value})


def test_an_interrupted_cache_write_leaves_no_temporary_file_and_clear_sweeps_old_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    import pqloader._cache

    cache = Cache(tmp_path)
    cache.put("s3://b/k", "v1", 0, 3, b"abc")

    def interrupted(f: Any, *args: Any) -> int:
        f.write(b"partial")
        raise KeyboardInterrupt  # Ctrl-C mid-write (it reaches worker processes too)

    with monkeypatch.context() as patch:
        patch.setattr(pqloader._cache, "write", interrupted)
        with pytest.raises(KeyboardInterrupt):
            cache.put("s3://b/k", "v1", 3, 3, b"def")
    assert not list(tmp_path.rglob(".tmp-*"))
    # a writer killed mid-write (SIGKILL) leaves one: clear deletes it once it is a minute old
    left = next(tmp_path.rglob("*.pqc")).with_name(f".tmp-999999-{'d' * 32}")
    left.write_bytes(b"x" * 100)
    os.utime(left, (time.time() - 120, time.time() - 120))
    cache.clear()
    assert not left.exists()


def test_clear_waits_for_an_eviction_under_way_and_deletes_everything(tmp_path: Path) -> None:
    """It returned "0 freed" at once, every entry kept, while a job was evicting."""
    import fcntl
    import time

    cache = Cache(tmp_path)
    for i in range(5):
        cache.put("s3://b/k", "v1", i * 100, 100, b"x" * 100)
    with open(cache._root / ".lock", "a+b") as lock:  # a job evicting, in another process
        fcntl.flock(lock, fcntl.LOCK_EX)
        done: list[int] = []
        thread = threading.Thread(target=lambda: done.append(Cache(tmp_path).clear()))
        thread.start()
        time.sleep(0.3)
        assert not done  # waiting its turn
        fcntl.flock(lock, fcntl.LOCK_UN)
        thread.join(10)
    assert done and done[0] > 0
    assert cache.entries() == []


def test_access_denied_says_why_when_the_error_itself_does_not() -> None:
    """s3fs raises PermissionError(None) from botocore's AccessDenied: "access denied (None)"."""
    from pqloader._retry import remote_error

    denied = _raised_from(PermissionError(None), RuntimeError("An error occurred (AccessDenied)"))
    message = str(remote_error("s3://b/k", denied, 1, "fatal"))
    assert "access denied (An error occurred (AccessDenied))" in message, message


def test_inspect_skips_bad_footers_not_failed_reads(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """--skip-bad-files of a dataset opened from its manifest reads its footers one at a time
    once reading them together fails: a read that failed after its retries raises, as
    without a manifest, and is no bad file (found in review)."""
    import fsspec

    import pqloader._discover as discover
    from pqloader._inspect import inspect_dataset

    root = tmp_path / "ds"
    pqloader.write_dataset(pa.table({"x": list(range(400))}), root, rows_per_file=100)
    fs = fsspec.filesystem("memory")
    for path in root.iterdir():
        fs.pipe(f"/inspected/{path.name}", path.read_bytes())
    part = (root / "part-00001.parquet").read_bytes()  # damaged at its size: the manifest
    fs.pipe("/inspected/part-00001.parquet", part[:-4] + b"XXXX")  # holds, no footer read
    facts = inspect_dataset("memory://inspected/", skip_bad_files=True)
    assert [Path(s["path"]).name for s in facts["skipped"]] == ["part-00001.parquet"]
    assert facts["num_rows"] == 300
    fs.pipe("/inspected/part-00001.parquet", part)
    real = discover.remote_footer

    def flaky(store: Any, cache: Any, info: Any) -> Any:
        if "00002" in str(info):
            raise pqloader.RemoteIOError("part-00002.parquet: 503 SlowDown after 8 retries")
        return real(store, cache, info)

    monkeypatch.setattr(discover, "remote_footer", flaky)
    with pytest.raises(pqloader.RemoteIOError, match="SlowDown"):
        inspect_dataset("memory://inspected/", skip_bad_files=True)
