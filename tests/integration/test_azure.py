"""The Azure Blob server (tests/azure_blob_server.py) as adlfs and the Azure SDK see it, so that
remote-IO tests can trust it: listings, properties, ranges, writes, faults, a Parquet round trip.

adlfs only here; pqloader over az:// is tested elsewhere. Each test works in its own container.
"""

from __future__ import annotations

import email.utils
import math
import os
import re
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import servers

FILES = {"a.bin": os.urandom(1000), "dir/b.txt": b"hello\n", "dir/sub/c.bin": os.urandom(300_000),
         "dir/sub/empty": b"", "dir2/e.bin": b"x"}
ETAG = re.compile(r'"0x8D[0-9A-F]{13}"')


def _fs(server: servers.AzureBlobServer, retry_policy: Any = None, **client: Any) -> Any:
    """A fresh adlfs filesystem on ``server``; ``retry_policy`` or ``client`` keywords (e.g.
    ``retry_total=0``) go to its ``BlobServiceClient``, which adlfs has no argument for: the
    client adlfs made is swapped for one made with them (it has opened no connection yet)."""
    import fsspec

    fs = fsspec.filesystem("az", **server.storage_options(), skip_instance_cache=True)
    if retry_policy is not None or client:
        from azure.storage.blob.aio import BlobServiceClient

        if retry_policy is not None:
            client["retry_policy"] = retry_policy
        fs.service_client = BlobServiceClient.from_connection_string(server.connection_string,
                                                                     **client)
    return fs


def _ops(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """REST operations served between two ``stats()``, and ``faults`` among them."""
    ops = {k: v - before["operations"].get(k, 0) for k, v in after["operations"].items()}
    ops["faults"] = after["faults_served"] - before["faults_served"]
    return {k: v for k, v in ops.items() if v}


@pytest.fixture
def tree(azure_blob: servers.AzureBlobServer) -> Iterator[str]:
    """A new container holding ``FILES``, written straight into the server's folder."""
    container = azure_blob.create_container()
    for name, data in FILES.items():
        path = azure_blob.root / container / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    yield container
    azure_blob.faults(503, "ServerBusy", 0)  # in case a test failed with a fault pending


def test_ls_lists_files_and_pseudo_directories(azure_blob: servers.AzureBlobServer,
                                               tree: str) -> None:
    fs = _fs(azure_blob)
    assert tree in fs.ls("")
    assert fs.ls(tree) == [f"{tree}/a.bin", f"{tree}/dir", f"{tree}/dir2"]
    assert fs.ls(f"{tree}/dir/") == [f"{tree}/dir/b.txt", f"{tree}/dir/sub"]
    detail = {d["name"]: d for d in fs.ls(f"{tree}/dir/sub", detail=True)}
    assert {k: (v["type"], v["size"]) for k, v in detail.items()} == {
        f"{tree}/dir/sub/c.bin": ("file", 300_000), f"{tree}/dir/sub/empty": ("file", 0)}
    assert {d["name"]: d["type"] for d in fs.ls(tree, detail=True)} == {
        f"{tree}/a.bin": "file", f"{tree}/dir": "directory", f"{tree}/dir2": "directory"}
    assert fs.find(tree) == sorted(f"{tree}/{name}" for name in FILES)
    with pytest.raises(FileNotFoundError):
        fs.ls(f"{tree}/nowhere")


def test_info_exists_and_missing_blobs(azure_blob: servers.AzureBlobServer, tree: str) -> None:
    fs = _fs(azure_blob)
    info = fs.info(f"{tree}/dir/sub/c.bin")
    assert (info["name"], info["type"], info["size"]) == (f"{tree}/dir/sub/c.bin", "file", 300_000)
    assert ETAG.fullmatch(info["etag"]), info["etag"]  # quoted, in Azure's shape
    mtime = (azure_blob.root / tree / "dir/sub/c.bin").stat().st_mtime
    assert isinstance(info["last_modified"], datetime)
    assert abs(info["last_modified"].timestamp() - mtime) < 1  # RFC 1123: whole seconds
    assert info["content_settings"]["content_type"] == "application/octet-stream"
    assert fs.info(f"{tree}/dir") == {"name": f"{tree}/dir", "size": None, "type": "directory"}
    assert fs.info(tree)["type"] == "directory"
    assert fs.exists(f"{tree}/a.bin") and fs.exists(f"{tree}/dir") and fs.exists(tree)
    assert not fs.exists(f"{tree}/nope") and not fs.exists("no-such-container")
    assert fs.isfile(f"{tree}/a.bin") and fs.isdir(f"{tree}/dir/sub")
    for call in (fs.info, fs.cat_file, fs.open):
        with pytest.raises(FileNotFoundError):
            call(f"{tree}/nope.bin")
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"no-such-container/{tree}")


def test_cat_file_ranges_are_the_bytes_on_disk(azure_blob: servers.AzureBlobServer,
                                               tree: str) -> None:
    fs = _fs(azure_blob)
    data = (azure_blob.root / tree / "dir/sub/c.bin").read_bytes()
    for start, end in [(0, 4), (10, 20), (299_990, 300_000), (299_990, 400_000), (0, None),
                       (123_456, None), (None, None)]:
        got = fs.cat_file(f"{tree}/dir/sub/c.bin", start=start, end=end)
        assert got == data[start:end], (start, end)
    starts = list(range(0, 300_000, 9_000))  # concurrent GETs, over several connections
    got = fs.cat_ranges([f"{tree}/dir/sub/c.bin"] * len(starts), starts,
                        [s + 10_000 for s in starts])
    assert got == [data[s:s + 10_000] for s in starts]
    assert fs.cat_file(f"{tree}/dir/sub/empty") == b""  # a ranged GET gets 416, then a plain GET
    assert fs.cat(f"{tree}/dir/b.txt") == b"hello\n"


def test_open_reads_in_several_ranged_gets(azure_blob: servers.AzureBlobServer,
                                           tree: str) -> None:
    fs, block = _fs(azure_blob), 64 * 1024
    before = azure_blob.stats()
    with fs.open(f"{tree}/dir/sub/c.bin", "rb", block_size=block) as f:
        got = b"".join(iter(lambda: f.read(block), b""))
    assert got == FILES["dir/sub/c.bin"]
    ops = _ops(before, azure_blob.stats())  # fsspec's readahead: a miss asks a block ahead
    assert ops["GetBlobProperties"] == 1 and ops["GetBlob"] >= math.ceil(300_000 / (2 * block))


def test_glob(azure_blob: servers.AzureBlobServer, tree: str) -> None:
    fs = _fs(azure_blob)
    assert fs.glob(f"{tree}/**/*.bin") == [f"{tree}/{n}" for n in ("a.bin", "dir/sub/c.bin",
                                                                   "dir2/e.bin")]
    assert fs.glob(f"{tree}/dir/*") == [f"{tree}/dir/b.txt", f"{tree}/dir/sub"]
    assert fs.glob(f"{tree}/*/sub/*") == [f"{tree}/dir/sub/c.bin", f"{tree}/dir/sub/empty"]
    assert fs.glob(f"{tree}/nope*") == []


def test_writes_land_in_the_folder(azure_blob: servers.AzureBlobServer, tree: str,
                                   tmp_path: Path) -> None:
    fs, root = _fs(azure_blob), azure_blob.root / tree
    before = azure_blob.stats()
    fs.pipe(f"{tree}/new/x.txt", b"piped")
    assert fs.cat(f"{tree}/new/x.txt") == b"piped" == (root / "new/x.txt").read_bytes()
    info = fs.info(f"{tree}/new/x.txt")
    assert info["metadata"] == {"is_directory": "false"} and info["size"] == 5
    old = info["etag"]
    fs.pipe(f"{tree}/new/x.txt", b"piped again")
    assert fs.info(f"{tree}/new/x.txt", refresh=True)["etag"] != old
    assert _ops(before, azure_blob.stats())["PutBlob"] == 2
    before = azure_blob.stats()
    with fs.open(f"{tree}/blocks.bin", "wb", block_size=5) as f:  # staged blocks, then a list
        f.write(b"0123456789abcdefghij")
    assert (root / "blocks.bin").read_bytes() == b"0123456789abcdefghij"
    ops = _ops(before, azure_blob.stats())
    assert ops["PutBlock"] >= 2 and ops["PutBlockList"] == 1, ops
    (tmp_path / "local.bin").write_bytes(b"from disk" * 1000)
    fs.put(str(tmp_path / "local.bin"), f"{tree}/put/local.bin")
    assert (root / "put/local.bin").read_bytes() == b"from disk" * 1000
    fs.rm(f"{tree}/put/local.bin")
    assert not (root / "put").exists() and not fs.exists(f"{tree}/put/local.bin")
    fs.mkdir(container := f"{tree}-made")
    assert (azure_blob.root / container).is_dir() and container in fs.ls("", refresh=True)
    assert not [p for p in root.rglob("*") if ".azb-tmp-" in p.name]  # no temp files left


def test_parquet_through_pyarrow(azure_blob: servers.AzureBlobServer, tree: str) -> None:
    fs = _fs(azure_blob)
    table = pa.table({"id": pa.array(range(5000), pa.int64()),
                      "text": [f"row {i}" for i in range(5000)]})
    pq.write_table(table, azure_blob.root / tree / "t.parquet", row_group_size=1000)
    assert pq.read_table(f"{tree}/t.parquet", filesystem=fs).equals(table)
    assert pq.read_table(f"{tree}/t.parquet", filesystem=fs, columns=["id"]).equals(
        table.select(["id"]))
    pq.write_table(table, f"{tree}/out/w.parquet", filesystem=fs)  # and a write through adlfs
    assert pq.read_table(azure_blob.root / tree / "out/w.parquet").equals(table)


def test_503_without_retries_raises_http_response_error(azure_blob: servers.AzureBlobServer,
                                                        tree: str) -> None:
    from azure.core.exceptions import HttpResponseError

    fs = _fs(azure_blob, retry_total=0)
    path = f"{tree}/a.bin"
    before = azure_blob.stats()
    azure_blob.faults(503, "ServerBusy", 1)
    with pytest.raises(HttpResponseError) as caught:
        fs.cat_file(path, start=0, end=10)
    err = caught.value
    assert type(err) is HttpResponseError  # not a subclass (ResourceNotFoundError...)
    assert (err.status_code, err.error_code, err.reason) == (503, "ServerBusy",
                                                             "Service Unavailable")
    assert str(err).startswith("The server is busy.\nRequestId:")
    assert "\nErrorCode:ServerBusy\nContent: <?xml" in str(err)  # the body, as sent
    assert _ops(before, azure_blob.stats()) == {"GetBlob": 1, "faults": 1}
    assert fs.cat_file(path, start=0, end=10) == FILES["a.bin"][:10]  # the next one is served
    # a HEAD's error has no body: the code comes from x-ms-error-code alone
    azure_blob.faults(503, "ServerBusy", 1, methods=("HEAD",))
    with pytest.raises(HttpResponseError) as caught:
        fs.info(path, refresh=True)
    assert (caught.value.status_code, caught.value.error_code) == (503, "ServerBusy")
    assert str(caught.value) == ("Operation returned an invalid status 'Service Unavailable'"
                                 "\nErrorCode:ServerBusy")


def test_sdk_default_retries_make_four_attempts(azure_blob: servers.AzureBlobServer,
                                                tree: str) -> None:
    from azure.core.exceptions import HttpResponseError
    from azure.storage.blob.aio import ExponentialRetry

    # the SDK's default policy (3 retries) without its 15 s, 18 s, 24 s... waits
    fs = _fs(azure_blob, ExponentialRetry(initial_backoff=0, increment_base=0,
                                          random_jitter_range=0))
    path = f"{tree}/a.bin"
    before = azure_blob.stats()
    azure_blob.faults(503, "ServerBusy", 1)
    assert fs.cat_file(path, start=5, end=10) == FILES["a.bin"][5:10]  # retried, served
    assert _ops(before, azure_blob.stats()) == {"GetBlob": 2, "faults": 1}
    before = azure_blob.stats()
    azure_blob.faults(500, "InternalError", 10)
    with pytest.raises(HttpResponseError) as caught:
        fs.cat_file(path, start=5, end=10)
    assert (caught.value.status_code, caught.value.error_code) == (500, "InternalError")
    assert _ops(before, azure_blob.stats()) == {"GetBlob": 4, "faults": 4}
    assert azure_blob.stats()["faults_pending"] == 6


def _get(url: str, method: str = "GET", **headers: str) -> tuple[int, Any, bytes]:
    req = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def test_rest_protocol_details(azure_blob: servers.AzureBlobServer, tree: str) -> None:
    """What adlfs does not show: headers, error bodies, ranges past the end, list paging."""
    base = f"{azure_blob.endpoint_url}/{azure_blob.account}/{tree}"
    status, head, body = _get(f"{base}/a.bin", **{"x-ms-range": "bytes=2-5",
                                                  "x-ms-version": "2025-01-05"})
    assert (status, body, head["Content-Range"]) == (206, FILES["a.bin"][2:6], "bytes 2-5/1000")
    assert ETAG.fullmatch(head["ETag"]) and head["x-ms-blob-type"] == "BlockBlob"
    assert head["x-ms-version"] == "2025-01-05" and head["x-ms-request-id"]
    assert head["Accept-Ranges"] == "bytes" and head["Content-Length"] == "4"
    for name in ("Last-Modified", "x-ms-creation-time"):
        assert email.utils.parsedate_to_datetime(head[name]).tzinfo is not None
    status, head, body = _get(f"{base}/a.bin", Range="bytes=1000-")
    assert (status, head["x-ms-error-code"], head["Content-Range"]) == (416, "InvalidRange",
                                                                        "bytes */1000")
    status, head, body = _get(f"{base}/nope")
    assert (status, head["x-ms-error-code"]) == (404, "BlobNotFound")
    assert ET.fromstring(body).findtext("Code") == "BlobNotFound"
    assert _get(f"{base}-nope/a.bin", "HEAD")[1]["x-ms-error-code"] == "ContainerNotFound"
    assert _get(f"{base}/a.bin")[2] == FILES["a.bin"]  # no range: 200, all of it
    seen, marker = [], ""
    while True:  # two at a time, with prefixes
        url = f"{base}?restype=container&comp=list&delimiter=/&maxresults=2&marker={marker}"
        status, head, body = _get(url)
        xml = ET.fromstring(body)
        seen += [(el.tag, el.findtext("Name")) for el in xml.iterfind("Blobs/*")]
        if not (marker := xml.findtext("NextMarker") or ""):
            break
    assert seen == [("Blob", "a.bin"), ("BlobPrefix", "dir/"), ("BlobPrefix", "dir2/")]


def test_server_stops_and_leaves_nothing_behind() -> None:
    pytest.importorskip("adlfs")
    with servers.AzureBlobServer() as other:
        procs, folder = [p for p, _ in other._procs], other.dir
        assert all(p.poll() is None for p in procs) and other.root.is_dir()
        assert other.stats()["requests"] == {}
    assert all(p.poll() is not None for p in procs) and not folder.exists()
