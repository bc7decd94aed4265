"""A small Azure Blob Storage server over a folder, for adlfs tests where Azurite (npm only)
cannot be installed.

    python tests/azure_blob_server.py --root DIR --port PORT [--host 127.0.0.1] [--verbose]

Account ``devstoreaccount1``, path-style URLs as in Azurite: ``http://HOST:PORT/devstoreaccount1/
<container>/<blob>``. Each top-level folder of DIR is a container, each file below it a block
blob named by its relative path. Authorization is not checked. Served as the REST API has them
(XML bodies, ``x-ms-*`` headers, XML errors with ``x-ms-error-code``): List Containers, Create /
Delete Container, Get Container Properties, List Blobs (prefix, delimiter, marker, maxresults),
Get Blob (ranges), Get Blob Properties, Put Blob, Put Block, Put Block List, Delete Blob. Writes
land atomically (temp file, then rename); content types and metadata written are kept in memory.

For retry tests, ``POST /_control/faults`` with ``{"status": 503, "code": "ServerBusy", "count":
5, "methods": ["GET"]}`` fails the next ``count`` matching requests with that status and Azure's
error body (``count`` 0 clears it); ``GET /_control/stats`` counts requests by method and by
operation, and the faults served. Standard library only.
"""

from __future__ import annotations

import argparse
import base64
import email.utils
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import uuid
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit
from xml.sax.saxutils import escape

ACCOUNT = "devstoreaccount1"
API_VERSION = "2025-11-05"  # answered when a request names none
OCTET = "application/octet-stream"
TMP_MARK = ".azb-tmp-"  # files being written; never listed
CONTAINER_RE = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}")
MESSAGES = {
    "BlobNotFound": "The specified blob does not exist.",
    "ContainerNotFound": "The specified container does not exist.",
    "ResourceNotFound": "The specified resource does not exist.",
    "ContainerAlreadyExists": "The specified container already exists.",
    "BlobAlreadyExists": "The specified blob already exists.",
    "InvalidRange": "The range specified is invalid for the current size of the resource.",
    "InvalidBlockList": "The specified block list is invalid.",
    "ConditionNotMet": "The condition specified using HTTP conditional header(s) is not met.",
    "InvalidResourceName": "The specifed resource name contains invalid characters.",
    "ServerBusy": "The server is busy.",
    "InternalError": "The server encountered an internal error. Please retry the request.",
}
BLOB_XML = (  # one <Blob> of a listing
    "<Blob><Name>{name}</Name><Properties><Creation-Time>{created}</Creation-Time><Last-Modified>"
    "{modified}</Last-Modified><Etag>{etag}</Etag><Content-Length>{size}</Content-Length>"
    "<Content-Type>{ctype}</Content-Type><BlobType>BlockBlob</BlobType><AccessTier>Hot"
    "</AccessTier><AccessTierInferred>true</AccessTierInferred><LeaseStatus>unlocked</LeaseStatus>"
    "<LeaseState>available</LeaseState><ServerEncrypted>true</ServerEncrypted></Properties>"
    "{metadata}</Blob>")


class StorageError(Exception):
    """An error answered as Azure does: status, ``x-ms-error-code`` and an XML body."""

    def __init__(self, status: int, code: str, message: str = "", **headers: str) -> None:
        super().__init__(code)
        self.status, self.code, self.headers = status, code, headers
        self.message = message or MESSAGES.get(code, code)


def http_date(ts: float) -> str:
    return email.utils.formatdate(ts, usegmt=True)


def dated(st: os.stat_result) -> dict[str, str]:
    """ETag (Azure's shape: 0x8D + 13 hex digits, new with each write) and Last-Modified."""
    tag = (st.st_mtime_ns ^ st.st_size ^ (st.st_ino << 20)) & (16**13 - 1)
    return {"ETag": f'"0x8D{tag:013X}"', "Last-Modified": http_date(st.st_mtime)}


class BlobServer(ThreadingHTTPServer):
    """The HTTP server, and the state its request threads share under one lock."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, root: Path, address: tuple[str, int], verbose: bool) -> None:
        super().__init__(address, Handler)
        self.root, self.verbose, self.lock = root, verbose, threading.Lock()
        self.fault: dict[str, Any] = {"count": 0}
        self.requests: Counter[str] = Counter()
        self.operations: Counter[str] = Counter()
        self.faults_served = 0
        self.blocks: dict[str, dict[str, bytes]] = {}  # "container/blob" -> staged blocks
        self.props: dict[str, tuple[str, dict[str, str]]] = {}  # -> content type, metadata

    def count(self, method: str, op: str) -> dict[str, Any] | None:
        """Count a request; return the fault it is to get, if any."""
        with self.lock:
            self.requests[method] += 1
            self.operations[op] += 1
            if self.fault["count"] > 0 and method in self.fault["methods"]:
                self.fault["count"] -= 1
                self.faults_served += 1
                return dict(self.fault)
        return None


class Handler(BaseHTTPRequestHandler):
    """One request: name its operation, serve a fault if one is due, else run ``op_<name>``."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's connection pool expects
    server_version, sys_version = "Windows-Azure-Blob/1.0", "Microsoft-HTTPAPI/2.0"
    server: BlobServer

    def handle_request(self) -> None:
        self.rid, self.op = str(uuid.uuid4()), "Control"
        url = urlsplit(self.path)
        pairs = (p.partition("=") for p in url.query.split("&") if p)
        self.query = {unquote(k): unquote(v) for k, _, v in pairs}  # a "+" stays a "+"
        body = self.read_body()
        if url.path.startswith("/_control/"):
            return self.control(url.path, body)
        account, self.container, self.blob = [*unquote(url.path)[1:].split("/", 2), "", ""][:3]
        self.op = self.operation()
        try:
            if fault := self.server.count(self.command, self.op):
                raise StorageError(fault["status"], fault["code"], fault["message"])
            if account != ACCOUNT:
                raise StorageError(404, "ResourceNotFound")
            getattr(self, f"op_{self.op}")(body)
        except StorageError as exc:
            now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f0Z")
            xml = (f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{exc.code}</Code>'
                   f"<Message>{escape(exc.message)}\nRequestId:{self.rid}\nTime:{now}</Message>"
                   "</Error>")
            self.send(exc.status, {"Content-Type": "application/xml", "x-ms-error-code": exc.code,
                                   **exc.headers}, xml.encode())

    do_GET = do_HEAD = do_PUT = do_DELETE = do_POST = handle_request

    def operation(self) -> str:
        key = (self.command, self.query.get("comp", ""))
        if not self.container:
            return "ListContainers" if key == ("GET", "list") else "Unsupported"
        if not self.blob:
            ops = {("PUT", ""): "CreateContainer", ("DELETE", ""): "DeleteContainer",
                   ("GET", ""): "GetContainerProperties", ("HEAD", ""): "GetContainerProperties",
                   ("GET", "list"): "ListBlobs"}
            return ops.get(key, "Unsupported") if self.query.get("restype") == "container" \
                else "Unsupported"
        return {("GET", ""): "GetBlob", ("HEAD", ""): "GetBlobProperties", ("PUT", ""): "PutBlob",
                ("PUT", "block"): "PutBlock", ("PUT", "blocklist"): "PutBlockList",
                ("DELETE", ""): "DeleteBlob"}.get(key, "Unsupported")

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        chunks = []
        while size := int(self.rfile.readline().split(b";")[0], 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
            pass
        return b"".join(chunks)

    def send(self, status: int, headers: dict[str, str] | None = None, body: bytes = b"",
             length: int | None = None) -> None:
        self.send_response(status)
        headers = {"x-ms-request-id": self.rid, **(headers or {}),
                   "x-ms-version": self.headers.get("x-ms-version", API_VERSION),
                   "Content-Length": str(len(body) if length is None else length)}
        if client_id := self.headers.get("x-ms-client-request-id"):
            headers["x-ms-client-request-id"] = client_id
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        rng = self.headers.get("x-ms-range") or self.headers.get("Range") or ""
        self.log_message("%s %s %s -> %s %s", self.command, self.op, self.path, code, rng)

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            sys.stderr.write(f"{self.log_date_time_string()} {format % args}\n")

    def control(self, path: str, body: bytes) -> None:
        """The test switches: ``POST /_control/faults`` (JSON) and ``GET /_control/stats``."""
        srv, out = self.server, None
        if (self.command, path) == ("POST", "/_control/faults"):
            spec = json.loads(body or b"{}")
            out = {"status": int(spec.get("status", 503)), "count": int(spec.get("count", 1)),
                   "code": str(spec.get("code", "ServerBusy")),
                   "methods": [m.upper() for m in spec.get("methods", ["GET"])],
                   "message": str(spec.get("message", ""))}
            with srv.lock:
                srv.fault = out
        elif (self.command, path) == ("GET", "/_control/stats"):
            with srv.lock:
                out = {"requests": dict(srv.requests), "operations": dict(srv.operations),
                       "faults_served": srv.faults_served, "faults_pending": srv.fault["count"]}
        if out is None:
            return self.send(404, {"Content-Type": "text/plain"}, b"no such control\n")
        self.send(200, {"Content-Type": "application/json"}, json.dumps(out).encode())

    # --- paths and properties

    def container_dir(self, must_exist: bool = True) -> Path:
        if not CONTAINER_RE.fullmatch(self.container):
            raise StorageError(400, "InvalidResourceName")
        path = self.server.root / self.container
        if must_exist and not path.is_dir():
            raise StorageError(404, "ContainerNotFound")
        return path

    def blob_path(self) -> Path:
        parts = self.blob.split("/")
        if any(p in ("", ".", "..") or p.startswith(TMP_MARK) for p in parts):
            raise StorageError(400, "InvalidResourceName")
        return self.container_dir().joinpath(*parts)

    def blob_headers(self) -> tuple[Path, os.stat_result, dict[str, str]]:
        """The blob's file, its stat, and the headers Get Blob and Get Blob Properties share."""
        path = self.blob_path()
        if not path.is_file():
            raise StorageError(404, "BlobNotFound")
        st = path.stat()
        ctype, meta = self.server.props.get(f"{self.container}/{self.blob}", (OCTET, {}))
        headers = {"Content-Type": ctype, **dated(st), "x-ms-blob-type": "BlockBlob",
                   "x-ms-creation-time": http_date(min(st.st_ctime, st.st_mtime)),
                   "x-ms-lease-status": "unlocked", "x-ms-lease-state": "available",
                   "x-ms-server-encrypted": "true", "Accept-Ranges": "bytes"}
        if (match := self.headers.get("If-Match")) and match not in ("*", headers["ETag"]):
            raise StorageError(412, "ConditionNotMet")
        return path, st, headers | {f"x-ms-meta-{k}": v for k, v in meta.items()}

    # --- operations, named as in the REST API's reference

    def op_Unsupported(self, body: bytes) -> None:
        raise StorageError(400, "UnsupportedQueryParameter", f"{self.command} {self.path}: "
                           "this operation is not served here.")

    def op_GetBlobProperties(self, body: bytes) -> None:
        _, st, headers = self.blob_headers()
        self.send(200, headers | {"x-ms-access-tier": "Hot", "x-ms-access-tier-inferred": "true"},
                  length=st.st_size)

    def op_GetBlob(self, body: bytes) -> None:
        path, st, headers = self.blob_headers()
        start, end, status, size = 0, st.st_size - 1, 200, st.st_size
        want = self.headers.get("x-ms-range") or self.headers.get("Range") or ""
        if m := re.fullmatch(r"bytes=(\d+)-(\d*)", want.strip()):
            start, end, status = int(m[1]), min(int(m[2] or size - 1), size - 1), 206
            if start >= size or (m[2] and int(m[2]) < start):
                raise StorageError(416, "InvalidRange", **{"Content-Range": f"bytes */{size}"})
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        self.send(status, headers, length=end - start + 1)
        with path.open("rb") as f:
            f.seek(start)
            left = end - start + 1
            while left > 0 and (chunk := f.read(min(left, 1 << 20))):
                self.wfile.write(chunk)
                left -= len(chunk)

    def op_PutBlob(self, body: bytes) -> None:
        if self.headers.get("x-ms-blob-type") != "BlockBlob":
            raise StorageError(400, "UnsupportedHeader", "Only block blobs are served here.")
        md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
        self.send(201, self.commit(body) | {"Content-MD5": md5})

    def op_PutBlock(self, body: bytes) -> None:
        self.blob_path()
        with self.server.lock:
            staged = self.server.blocks.setdefault(f"{self.container}/{self.blob}", {})
            staged[self.query.get("blockid", "")] = body
        self.send(201, {"x-ms-request-server-encrypted": "true"})

    def op_PutBlockList(self, body: bytes) -> None:
        key = f"{self.container}/{self.blob}"
        try:
            ids = [el.text or "" for el in ET.fromstring(body)]  # <Latest>, <Uncommitted>...
        except ET.ParseError:
            raise StorageError(400, "InvalidXmlDocument") from None
        with self.server.lock:
            staged = self.server.blocks.get(key, {})
            if any(i not in staged for i in ids):
                raise StorageError(400, "InvalidBlockList")
            data = b"".join(staged[i] for i in ids)
        headers = self.commit(data)
        with self.server.lock:
            self.server.blocks.pop(key, None)
        self.send(201, headers)

    def commit(self, data: bytes) -> dict[str, str]:
        """Write the blob atomically, keep the request's content type and metadata; return the
        response's headers."""
        path = self.blob_path()
        if self.headers.get("If-None-Match") == "*" and path.exists():
            raise StorageError(409, "BlobAlreadyExists")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=TMP_MARK, dir=path.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except (NotADirectoryError, IsADirectoryError, FileExistsError) as exc:
            raise StorageError(409, "InvalidResourceName",
                               f"A folder and a blob cannot share a name here: {exc}") from exc
        meta = {k[10:]: v for k, v in self.headers.items() if k.lower().startswith("x-ms-meta-")}
        with self.server.lock:
            self.server.props[f"{self.container}/{self.blob}"] = (
                self.headers.get("x-ms-blob-content-type", OCTET), meta)
        return {**dated(path.stat()), "x-ms-request-server-encrypted": "true"}

    def op_DeleteBlob(self, body: bytes) -> None:
        path, _, _ = self.blob_headers()
        path.unlink()
        with self.server.lock:
            self.server.props.pop(f"{self.container}/{self.blob}", None)
        top = self.container_dir()
        while (path := path.parent) != top and not any(path.iterdir()):
            path.rmdir()  # an empty folder is no blob, and would stand in the way of one
        self.send(202, {"x-ms-delete-type-permanent": "true"})

    def op_CreateContainer(self, body: bytes) -> None:
        path = self.container_dir(must_exist=False)
        try:
            path.mkdir()
        except FileExistsError:
            raise StorageError(409, "ContainerAlreadyExists") from None
        self.send(201, dated(path.stat()))

    def op_DeleteContainer(self, body: bytes) -> None:
        shutil.rmtree(self.container_dir())
        self.send(202)

    def op_GetContainerProperties(self, body: bytes) -> None:
        self.send(200, {**dated(self.container_dir().stat()), "x-ms-lease-status": "unlocked",
                        "x-ms-lease-state": "available", "x-ms-has-legal-hold": "false",
                        "x-ms-has-immutability-policy": "false"})

    # --- listings: names in order, from ``marker`` on, ``maxresults`` at a time

    def listing(self, names: list[str], tag: str, entry: Callable[[str], str],
                attrs: str = "") -> None:
        marker, prefix = self.query.get("marker", ""), self.query.get("prefix", "")
        limit = self.query.get("maxresults", "5000")
        if not limit.isdigit() or not 1 <= int(limit) <= 5000:
            raise StorageError(400, "OutOfRangeQueryParameterValue", "maxresults: 1 to 5000")
        names = [n for n in names if n >= marker]
        nxt, names = names[int(limit)] if len(names) > int(limit) else "", names[:int(limit)]
        echo = "".join(f"<{tag_}>{escape(value)}</{tag_}>" for tag_, value in [
            ("Prefix", prefix), ("Marker", marker), ("MaxResults", self.query.get("maxresults")),
            ("Delimiter", self.query.get("delimiter"))] if value)
        endpoint = escape(f"http://{self.headers.get('Host', 'localhost')}/{ACCOUNT}")
        xml = (f'<?xml version="1.0" encoding="utf-8"?><EnumerationResults ServiceEndpoint='
               f'"{endpoint}"{attrs}>{echo}<{tag}>{"".join(map(entry, names))}</{tag}>'
               f"<NextMarker>{escape(nxt)}</NextMarker></EnumerationResults>")
        self.send(200, {"Content-Type": "application/xml"}, xml.encode())

    def op_ListContainers(self, body: bytes) -> None:
        root, prefix = self.server.root, self.query.get("prefix", "")
        meta = "<Metadata/>" if "metadata" in self.query.get("include", "") else ""

        def entry(name: str) -> str:
            head = dated((root / name).stat())
            return (f"<Container><Name>{name}</Name><Properties><Last-Modified>"
                    f"{head['Last-Modified']}</Last-Modified><Etag>{head['ETag']}</Etag>"
                    "<LeaseStatus>unlocked</LeaseStatus><LeaseState>available</LeaseState>"
                    f"</Properties>{meta}</Container>")

        self.listing(sorted(p.name for p in root.iterdir() if p.is_dir() and p.name.startswith(
            prefix) and CONTAINER_RE.fullmatch(p.name)), "Containers", entry)

    def op_ListBlobs(self, body: bytes) -> None:
        top, prefix = self.container_dir(), self.query.get("prefix", "")
        delim, include = self.query.get("delimiter", ""), self.query.get("include", "")
        names: list[str] = []
        if ".." not in prefix.split("/"):  # walk only the folder the prefix names
            for folder, _, files in os.walk(top.joinpath(*prefix.split("/")[:-1])):
                rel = Path(folder).relative_to(top).as_posix()
                names += [f if rel == "." else f"{rel}/{f}" for f in files
                          if not f.startswith(TMP_MARK)]
        keys: list[str] = []  # blob names, and for each run of names below a delimiter, one
        for name in sorted(n for n in names if n.startswith(prefix)):
            cut = name.find(delim, len(prefix)) if delim else -1
            key = name if cut < 0 else name[:cut + len(delim)]
            if not keys or keys[-1] != key:
                keys.append(key)

        def entry(key: str) -> str:
            path = top.joinpath(*key.split("/"))
            if delim and key.endswith(delim) and not path.is_file():
                return f"<BlobPrefix><Name>{escape(key)}</Name></BlobPrefix>"
            st = path.stat()
            ctype, meta = self.server.props.get(f"{self.container}/{key}", (OCTET, {}))
            metadata = "".join(f"<{k}>{escape(v)}</{k}>" for k, v in meta.items())
            return BLOB_XML.format(
                name=escape(key), created=http_date(min(st.st_ctime, st.st_mtime)),
                modified=http_date(st.st_mtime), etag=dated(st)["ETag"].strip('"'),
                size=st.st_size, ctype=escape(ctype),
                metadata=f"<Metadata>{metadata}</Metadata>" if "metadata" in include else "")

        self.listing(keys, "Blobs", entry, f' ContainerName="{escape(self.container)}"')


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="one folder per container")
    parser.add_argument("--port", type=int, default=10000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--verbose", action="store_true", help="one line per request, stderr")
    args = parser.parse_args(argv)
    args.root.mkdir(parents=True, exist_ok=True)
    server = BlobServer(args.root.resolve(), (args.host, args.port), args.verbose)
    print(f"serving {args.root} at http://{args.host}:{server.server_port}/{ACCOUNT}",
          file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
