"""Real servers on loopback for remote-IO tests and benchmarks: moto S3, nginx, Ceph's RGW, GCS.

Each server is a context manager that owns its processes and a temporary folder (config, logs,
pid files, data) and removes both in ``close()``, also when start-up fails. Children get SIGKILL
if the process that started them dies, so a crashed test run leaves no server behind. No pytest
here: benchmarks import this module too (``sys.path.insert(0, "tests")``).

    with MotoS3() as s3:                                   # moto_server, in-memory S3
        url = s3.upload_dir("data/train")                  # -> "s3://pq-1a2b.../"
        pqloader.ParquetDataset(url, storage_options=s3.storage_options)
    with S3FaultProxy(s3, rate_per_s=20, latency_ms=20, drop_fraction=0.05) as proxy:
        proxy.storage_options                              # s3fs through nginx, same buckets
        proxy.requests()                                   # what nginx served: status, range...
    with NginxFiles("data/train") as http:                 # http.url -> "http://127.0.0.1:PORT"
    with RadosGateway() as rgw:                            # a real S3 (Ceph), ~3 s to start
    with GcsEmulator() as gcs:                             # gcp-storage-emulator, in memory
        url = gcs.upload_dir("data/train")                 # -> "gs://pq-1a2b.../"
    with GcsFaultProxy(gcs, rate_per_s=20) as proxy:       # the same faults, GCS's JSON errors
    with AzureBlobServer() as az:                          # tests/azure_blob_server.py, a folder
        url = az.upload_dir("data/train")                  # -> "az://pq-1a2b.../"
        az.storage_options()                               # adlfs: {"connection_string": ...}
        az.faults(503, "ServerBusy", 3)                    # the next 3 GETs fail; az.stats()

A server whose binaries are missing raises :class:`ServerUnavailable` naming the package to
install; the pytest fixtures turn that into a skip. ``python tests/servers.py moto|rgw|gcs|http
DIR`` runs one in the foreground for manual use.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

__all__ = [
    "AzureBlobServer",
    "GcsEmulator",
    "GcsFaultProxy",
    "GcsServer",
    "MotoS3",
    "NginxFiles",
    "RadosGateway",
    "S3FaultProxy",
    "S3Server",
    "ServerUnavailable",
    "free_port",
]

KEY = SECRET = "testing"
REGION = "us-east-1"
GCS_PROJECT = "pqloader-test"  # the project the emulator's buckets are made in
SLOWDOWN_XML = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    "<Message>Please reduce your request rate.</Message><RequestId>$request_id</RequestId></Error>"
)
# GCS's JSON errors by status: (reason, message), as the JSON API sends them
GCS_ERRORS = {
    403: ("forbidden", "Anonymous caller does not have storage.objects.get access to the "
                       "Google Cloud Storage object."),
    429: ("rateLimitExceeded", "The rate of requests exceeds the rate limit. Please reduce "
                               "your request rate."),
    503: ("backendError", "We encountered an internal error. Please try again."),
}
ECHO_MODULE = Path("/usr/lib/nginx/modules/ngx_http_echo_module.so")
NGINX_HINT = "nginx is not installed: apt-get install -y nginx-light (Debian/Ubuntu)"
# Azurite's well-known development account and key: the Azure SDK signs with it, nothing checks
AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
             "KBHBeksoGMGw==")
RGW_HINT = (
    "Ceph's RADOS Gateway is not installed: "
    "apt-get install -y --no-install-recommends radosgw ceph-mon ceph-osd ceph-common"
)


class ServerUnavailable(RuntimeError):
    """The server's binaries or Python packages are missing; the message says what to install."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (start-up retries on a lost race)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


_P = TypeVar("_P", bound="_Processes")


class _Processes:
    """Owns child processes and a temporary folder; ``close()`` ends and removes them all."""

    name = "server"

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"pqloader-{self.name}-"))
        self._procs: list[tuple[subprocess.Popen[bytes], Any]] = []
        self._kill_first: set[int] = set()
        atexit.register(self.close)

    def _spawn(self, args: list[str], log: str, *, kill: bool = False,
               env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        out = open(self.dir / log, "ab")  # noqa: SIM115 - closed in close()
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, cwd=self.dir, env=env,
                                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        self._procs.append((proc, out))
        if kill:
            self._kill_first.add(proc.pid)
        return proc

    def _log_tail(self, chars: int = 3000) -> str:
        parts = []
        for path in sorted(self.dir.rglob("*.log")):
            text = path.read_text(errors="replace")[-chars:]
            parts.append(f"--- {path.name}\n{text}")
        return "\n".join(parts)

    def _wait_http(self, url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        """Wait until ``url`` answers any HTTP status; fail early if ``proc`` exits."""
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {proc.returncode} at start:\n"
                                   f"{self._log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=1):
                    return
            except urllib.error.HTTPError:
                return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: {url} did not answer in {timeout_s} s:\n"
                                   f"{self._log_tail()}")
            time.sleep(0.05)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The server stopped (SIGSTOP) while the block runs: it accepts connections (the
        kernel does) and never answers; SIGCONT after."""
        procs = [p for p, _ in self._procs if p.poll() is None]
        for proc in procs:
            proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL after 10 s) and delete the folder."""
        procs, self._procs = self._procs, []
        for proc, _ in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL if proc.pid in self._kill_first
                                 else signal.SIGTERM)
        for proc, out in reversed(procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            out.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        atexit.unregister(self.close)

    def __enter__(self: _P) -> _P:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class S3Server(_Processes):
    """An S3 endpoint with the fixed test credentials, and helpers to fill it with data."""

    endpoint_url: str

    @property
    def storage_options(self) -> dict[str, Any]:
        """Keyword arguments for ``s3fs.S3FileSystem`` (and for pqloader's ``storage_options``)."""
        return {"key": KEY, "secret": SECRET,
                "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": REGION}}

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client for this endpoint (``config`` goes to ``botocore.config.Config``)."""
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:  # pragma: no cover
            raise ServerUnavailable("boto3 is missing: pip install -e '.[test]'") from exc
        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name=REGION,
                            aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                            config=Config(**config))

    def create_bucket(self, bucket: str | None = None) -> str:
        """Create ``bucket`` (default: a new unique name) and return its name."""
        bucket = bucket or f"pq-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=bucket)
        return bucket

    def upload_dir(self, local: str | os.PathLike[str], bucket: str | None = None,
                   prefix: str = "") -> str:
        """Upload every file under ``local`` to ``bucket/prefix``; return ``s3://bucket/prefix``.

        With no ``bucket`` a new one is created, so tests never see each other's objects.
        """
        bucket = bucket or self.create_bucket()
        client = self.client()
        prefix = _upload_tree(local, prefix, lambda path, key: client.upload_file(
            str(path), bucket, key))
        return f"s3://{bucket}/{prefix}"


class MotoS3(S3Server):
    """``moto_server`` in a child process: S3 semantics in memory, up in about a second.

    A child process rather than ``ThreadedMotoServer``: the server's threads then never share a
    GIL with the test, nor get copied into forked DataLoader workers.
    """

    name = "moto"

    def __init__(self, *, timeout_s: float = 30) -> None:
        exe = Path(sys.executable).with_name("moto_server")
        if not exe.exists():
            raise ServerUnavailable("moto_server is missing: pip install -e '.[test]' "
                                    "(moto[server])")
        super().__init__()
        try:
            for attempt in range(3):
                port = free_port()
                proc = self._spawn([str(exe), "-H", "127.0.0.1", "-p", str(port)], "moto.log")
                try:
                    self._wait_http(f"http://127.0.0.1:{port}/moto-api/", proc, timeout_s)
                    break
                except RuntimeError:
                    if attempt == 2 or "in use" not in self._log_tail():
                        raise
            self.endpoint_url = f"http://127.0.0.1:{port}"
        except BaseException:
            self.close()
            raise

    def reset(self) -> None:
        """Forget every bucket (moto's own reset endpoint)."""
        req = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass


class GcsServer(_Processes):
    """A GCS JSON API endpoint that gcsfs reaches with ``storage_options``, and helpers to fill
    it with data."""

    endpoint_url: str

    @property
    def storage_options(self) -> dict[str, Any]:
        """Keyword arguments for ``gcsfs.GCSFileSystem`` (and pqloader's ``storage_options``)."""
        return {"endpoint_url": self.endpoint_url, "token": "anon"}

    def _request(self, method: str, path: str, body: bytes, content_type: str) -> Any:
        req = urllib.request.Request(self.endpoint_url + path, data=body, method=method,
                                     headers={"Content-Type": content_type})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def create_bucket(self, bucket: str | None = None) -> str:
        """Create ``bucket`` (default: a new unique name) and return its name."""
        bucket = bucket or f"pq-{uuid.uuid4().hex[:16]}"
        self._request("POST", f"/storage/v1/b?project={GCS_PROJECT}",
                      json.dumps({"name": bucket}).encode(), "application/json")
        return bucket

    def upload_file(self, local: str | os.PathLike[str], bucket: str, key: str) -> str:
        """Upload one file as ``bucket/key`` (replacing it: a new generation); return its
        ``generation``."""
        name = urllib.parse.quote(key, safe="")
        meta = self._request("POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=media&"
                             f"name={name}", Path(local).read_bytes(),
                             "application/octet-stream")
        return str(meta["generation"])

    def upload_dir(self, local: str | os.PathLike[str], bucket: str | None = None,
                   prefix: str = "") -> str:
        """Upload every file under ``local`` to ``bucket/prefix``; return ``gs://bucket/prefix``.

        With no ``bucket`` a new one is created, so tests never see each other's objects.
        """
        bucket = bucket or self.create_bucket()
        prefix = _upload_tree(local, prefix, lambda path, key: self.upload_file(path, bucket, key))
        return f"gs://{bucket}/{prefix}"


class GcsEmulator(GcsServer):
    """``gcp-storage-emulator`` (pure Python, from PyPI) in a child process: the GCS JSON API
    with objects in memory, up in about half a second.

    gcsfs reaches it with ``storage_options`` (``endpoint_url``, ``token="anon"``). Recent gcsfs
    (2026.10) first asks each bucket's layout from the Storage Control API over gRPC, which no
    emulator serves: every call then retries that for 60 s. Set
    ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` before gcsfs is imported (tests/conftest.py does)
    for the plain ``GCSFileSystem``. The emulator's HTTP server answers one request at a time.
    """

    name = "gcs"

    def __init__(self, *, timeout_s: float = 30) -> None:
        if importlib.util.find_spec("gcp_storage_emulator") is None:
            raise ServerUnavailable("gcp-storage-emulator is missing: pip install -e '.[test]'")
        super().__init__()
        try:
            for attempt in range(3):
                port = free_port()
                # A port taken meanwhile kills only the emulator's server thread, not the
                # process: the wait then times out, and the log says "in use".
                proc = self._spawn([sys.executable, "-m", "gcp_storage_emulator", "start",
                                    "--host", "127.0.0.1", "--port", str(port), "--in-memory",
                                    "--quiet"], "gcs.log")
                try:
                    self._wait_http(f"http://127.0.0.1:{port}/", proc, timeout_s)
                    break
                except (RuntimeError, TimeoutError):
                    if attempt == 2 or "in use" not in self._log_tail():
                        raise
                    proc.kill()
            self.endpoint_url = f"http://127.0.0.1:{port}"
        except BaseException:
            self.close()
            raise


def _upload_tree(local: str | os.PathLike[str], prefix: str,
                 put: Callable[[Path, str], object]) -> str:
    """``put(path, key)`` for every file under ``local``, keys under ``prefix``; returns the
    prefix without its slashes."""
    root = Path(local)
    if not root.is_dir():
        raise NotADirectoryError(f"{root}: upload_dir needs a directory")
    prefix = prefix.strip("/")
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        put(path, "/".join(filter(None, [prefix, path.relative_to(root).as_posix()])))
    return prefix


def _nginx_exe() -> str:
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists()
                                    else None)
    if exe is None:
        raise ServerUnavailable(NGINX_HINT)
    return exe


class Request(NamedTuple):
    """One request as nginx logged it (``status`` 444: the connection was dropped)."""

    method: str
    path: str
    query: str
    status: int
    bytes_sent: int
    range: str
    seconds: float  # from its first byte read to its last byte sent
    end: float  # when it was answered (Unix time, to the millisecond)


class _Nginx(_Processes):
    """nginx as one foreground process with a generated config inside its own folder."""

    name = "nginx"

    def requests(self) -> list[Request]:
        """Every request served so far, oldest first (start-up probes left out).

        For counting: ``sum(r.method == "GET" for r in server.requests())`` data requests,
        ``[r for r in proxy.requests() if r.status == 503]`` throttled ones.
        """
        out = []
        log = self.dir / "access.log"
        for line in log.read_text().splitlines() if log.exists() else []:
            method, path, query, status, sent, byte_range, secs, end = line.split("\t")
            out.append(Request(method, path, query.removeprefix("-"), int(status), int(sent),
                               byte_range.removeprefix("-"), float(secs),  # "-": empty
                               float(end)))
        return out

    def settled_requests(self, quiet_s: float = 0.3, timeout_s: float = 10.0) -> list[Request]:
        """:meth:`requests` once the log stops growing. nginx writes a request's line after
        sending its response, so a client can hold the answer before the line is there: a
        count taken at once missed it, and the next count took it as a later request."""
        deadline = time.monotonic() + timeout_s
        before = self.requests()
        while time.monotonic() < deadline:
            time.sleep(quiet_s)
            now = self.requests()
            if len(now) == len(before):
                return now
            before = now
        return before

    def _start(self, server_block: str, *, http_extra: str = "", modules: str = "",
               timeout_s: float = 10) -> None:
        exe = _nginx_exe()
        d = self.dir
        for attempt in range(3):
            self.port = free_port()
            temp = "\n".join(f"    {kind}_temp_path {d}/{kind}_temp;"
                             for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
            conf = f"""{modules}
daemon off;
master_process off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    log_format pq "$request_method\t$uri\t$args\t$status\t"
                  "$body_bytes_sent\t$http_range\t$request_time\t$msec";
    access_log {d}/access.log pq;
{temp}
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
{http_extra}
    server {{
        listen 127.0.0.1:{self.port};
        location = /__pq_ready {{ access_log off; return 204; }}
{server_block}
    }}
}}
"""
            (d / "nginx.conf").write_text(conf)
            proc = self._spawn([exe, "-p", str(d), "-c", str(d / "nginx.conf"),
                                "-e", str(d / "error.log")], "stdout.log")
            try:
                self._wait_http(f"http://127.0.0.1:{self.port}/__pq_ready", proc, timeout_s)
                return
            except RuntimeError:
                if attempt == 2 or "in use" not in self._log_tail():
                    raise


class NginxFiles(_Nginx):
    """nginx serving ``directory`` over HTTP: range requests and an HTML index fsspec can list."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        root = Path(directory).resolve()
        if not root.is_dir():
            raise NotADirectoryError(f"{root}: NginxFiles serves a directory")
        super().__init__()
        try:
            self._start(f"""        root {root};
        location / {{ autoindex on; }}""")
        except BaseException:
            self.close()
            raise
        self.url = f"http://127.0.0.1:{self.port}"


class _FaultProxy(_Nginx):
    """nginx in front of an HTTP server, injecting throttling, latency and dropped connections.

    Each fault is off unless asked for, and independent of the others:

    - ``rate_per_s``: requests beyond this rate (plus ``burst``) get ``status`` with the
      store's own error body (``limit_req``, over all clients together);
    - ``latency_ms``: every forwarded request waits this long before it goes upstream (an
      ``auth_request`` to a location that runs the echo module's ``echo_sleep``);
    - ``drop_fraction``: this share of requests, drawn at random per request, get their
      connection closed with no response (``return 444``).

    A request is first drawn for dropping, then throttled, then delayed. The Host header is
    passed through unchanged, so signatures made for the proxy's address stay valid upstream.
    """

    def __init__(self, upstream_url: str, *, rate_per_s: float | None, burst: int,
                 latency_ms: float, drop_fraction: float, status: int, content_type: str,
                 error_body: str) -> None:
        if rate_per_s is not None and rate_per_s <= 0:
            raise ValueError(f"rate_per_s={rate_per_s}: must be positive, or None for no limit")
        if not 0 <= drop_fraction < 1:
            raise ValueError(f"drop_fraction={drop_fraction}: must be in [0, 1)")
        if latency_ms < 0 or burst < 0:
            raise ValueError(f"latency_ms={latency_ms}, burst={burst}: must be >= 0")
        if latency_ms and not ECHO_MODULE.exists():
            raise ServerUnavailable(f"latency needs nginx's echo module ({ECHO_MODULE}): "
                                    "apt-get install -y libnginx-mod-http-echo")
        _nginx_exe()
        self.rate_per_s, self.burst = rate_per_s, burst
        self.latency_ms, self.drop_fraction = latency_ms, drop_fraction
        super().__init__()
        upstream_hostport = upstream_url.split("://", 1)[1].rstrip("/")
        http_extra = f"""    upstream pq_upstream {{ server {upstream_hostport}; keepalive 64; }}
    client_max_body_size 0;
    proxy_request_buffering off;
    proxy_buffering off;"""
        location = []
        if drop_fraction:
            http_extra += f"""
    split_clients "$request_id" $pq_drop {{ {drop_fraction * 100:.2f}% 1; * 0; }}"""
            location.append("if ($pq_drop) { return 444; }")
        if rate_per_s is not None:
            rate = f"{rate_per_s:g}r/s" if rate_per_s >= 1 else f"{rate_per_s * 60:g}r/m"
            http_extra += f"""
    limit_req_zone $server_port zone=pq_limit:1m rate={rate};"""
            burst_arg = f" burst={burst} nodelay" if burst else ""
            location += [f"limit_req zone=pq_limit{burst_arg};",
                         f"limit_req_status {status};"]
        if latency_ms:
            location.append("auth_request /__pq_delay;")
        body = "\n".join(f"            {line}" for line in location)
        sleep_s = f"{latency_ms / 1000:.3f}"
        delay = (f"        location = /__pq_delay {{ internal; echo_sleep {sleep_s}; }}"
                 if latency_ms else "")
        server_block = f"""        error_page {status} @refused;
        location @refused {{
            default_type {content_type};
            return {status} '{error_body}';
        }}
{delay}
        location / {{
{body}
            proxy_pass http://pq_upstream;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
        }}"""
        modules = f"load_module {ECHO_MODULE};" if latency_ms else ""
        try:
            self._start(server_block, http_extra=http_extra, modules=modules)
        except BaseException:
            self.close()
            raise
        self.endpoint_url = f"http://127.0.0.1:{self.port}"


class S3FaultProxy(_FaultProxy, S3Server):
    """A :class:`_FaultProxy` in front of an S3 server: throttled requests get 503 with S3's
    ``SlowDown`` XML body. Uploads made with :meth:`upload_dir` and :meth:`create_bucket` go
    straight to the upstream.
    """

    name = "s3proxy"

    def __init__(self, upstream: S3Server, *, rate_per_s: float | None = None, burst: int = 0,
                 latency_ms: float = 0, drop_fraction: float = 0.0) -> None:
        self.upstream = upstream
        super().__init__(upstream.endpoint_url, rate_per_s=rate_per_s, burst=burst,
                         latency_ms=latency_ms, drop_fraction=drop_fraction, status=503,
                         content_type="application/xml", error_body=SLOWDOWN_XML)

    def create_bucket(self, bucket: str | None = None) -> str:
        return self.upstream.create_bucket(bucket)

    def upload_dir(self, local: str | os.PathLike[str], bucket: str | None = None,
                   prefix: str = "") -> str:
        return self.upstream.upload_dir(local, bucket, prefix)


class GcsFaultProxy(_FaultProxy, GcsServer):
    """A :class:`_FaultProxy` in front of a GCS server: throttled requests get ``status``
    with the JSON error GCS sends for it (503 ``backendError``, 429 ``rateLimitExceeded``; 403
    ``forbidden`` stands for an error that must not be retried). Buckets and uploads made here
    go straight to the upstream, past the faults.
    """

    name = "gcsproxy"

    def __init__(self, upstream: GcsServer, *, rate_per_s: float | None = None, burst: int = 0,
                 latency_ms: float = 0, drop_fraction: float = 0.0, status: int = 503) -> None:
        if status not in GCS_ERRORS:
            raise ValueError(f"status={status}: GcsFaultProxy answers {sorted(GCS_ERRORS)}")
        reason, message = GCS_ERRORS[status]
        error = {"code": status, "message": message,
                 "errors": [{"message": message, "domain": "global", "reason": reason}]}
        self.upstream = upstream
        super().__init__(upstream.endpoint_url, rate_per_s=rate_per_s, burst=burst,
                         latency_ms=latency_ms, drop_fraction=drop_fraction, status=status,
                         content_type="application/json",
                         error_body=json.dumps({"error": error}))

    def _request(self, method: str, path: str, body: bytes, content_type: str) -> Any:
        return self.upstream._request(method, path, body, content_type)


class RadosGateway(S3Server):
    """Ceph's RADOS Gateway on a throwaway single-node cluster: a real S3 implementation.

    One monitor, one OSD on ``memstore`` (data in memory), auth none, pools of size 1, and
    ``radosgw`` with the beast frontend on 127.0.0.1; an S3 user with the test keys. Start-up
    takes about 3 s (19 s with the default 1 s paxos proposal interval; the first bucket, which
    creates the data pools, is made here too) and the three daemons use about 140 MB.
    ``ms mon client mode = crc`` is needed: with auth none and the default (secure first),
    radosgw hangs at start.
    """

    name = "rgw"
    BINARIES = ("ceph-mon", "ceph-osd", "ceph", "radosgw", "radosgw-admin")

    def __init__(self, *, timeout_s: float = 120) -> None:
        missing = [b for b in self.BINARIES if shutil.which(b) is None]
        if missing:
            raise ServerUnavailable(f"{RGW_HINT} (missing: {', '.join(missing)})")
        super().__init__()
        try:
            self._start(timeout_s)
        except BaseException:
            self.close()
            raise

    def _conf(self, mon_port: int, rgw_port: int) -> Path:
        d = self.dir
        for sub in ("mon", "osd", "run", "log", "rgw"):
            (d / sub).mkdir()
        conf = d / "ceph.conf"
        conf.write_text(f"""[global]
fsid = {uuid.uuid4()}
mon host = 127.0.0.1:{mon_port}
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc
run dir = {d}/run
admin socket = {d}/run/$name.asok
log file = {d}/log/$name.log
pid file = {d}/run/$name.pid
chdir = ""
osd crush chooseleaf type = 0
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon max pg per osd = 1000
mon warn on pool no redundancy = false
mon data avail crit = 0
mon data = {d}/mon
osd data = {d}/osd
osd journal = {d}/osd/journal
osd objectstore = memstore
# memstore reports a 1 GiB device by default: past the full ratio the cluster stops taking
# writes, and an upload of W1 (1.5 GB) hung. Memory is used only as objects are written.
memstore device bytes = 17179869184
osd class load list = *
osd class default list = *
rgw data = {d}/rgw
rgw frontends = beast endpoint=127.0.0.1:{rgw_port}
rgw dynamic resharding = false
# Every pool RGW creates costs osdmap epochs, one per paxos proposal: 1 s each by default.
paxos propose interval = 0.05
paxos min wait = 0.01
""")
        return conf

    def _run(self, *args: str, timeout_s: float = 60) -> str:
        proc = subprocess.run([*args, "-c", str(self._conf_path)], capture_output=True,
                              text=True, timeout=timeout_s, cwd=self.dir, env=self._env)
        if proc.returncode:
            raise RuntimeError(f"rgw: {' '.join(args)} failed ({proc.returncode}):\n"
                               f"{proc.stdout}\n{proc.stderr}\n{self._log_tail()}")
        return proc.stdout

    def _start(self, timeout_s: float) -> None:
        mon_port, rgw_port = free_port(), free_port()
        self._conf_path = conf = self._conf(mon_port, rgw_port)
        self._env = {**os.environ, "CEPH_CONF": str(conf)}
        c = ["-c", str(conf)]
        self._run("ceph-mon", "--id", "a", "--mkfs", "--keyring", "/dev/null")
        (self.dir / "mon" / "keyring").touch()
        # Throwaway daemons: SIGKILL stops them at once (memstore would write its store to disk,
        # radosgw and the monitor take seconds to shut down cleanly).
        self._spawn(["ceph-mon", "--id", "a", "-f", *c], "mon.out.log", kill=True,
                    env=self._env)
        osd_id = self._run("ceph", "osd", "create").strip()
        self._run("ceph", "osd", "crush", "add", f"osd.{osd_id}", "1", "root=default")
        self._run("ceph-osd", "--id", osd_id, "--mkjournal", "--mkfs")
        self._spawn(["ceph-osd", "--id", osd_id, "-f", *c], "osd.out.log", kill=True,
                    env=self._env)
        rgw = self._spawn(["radosgw", "-n", "client.rgw", "-f", *c], "rgw.out.log", kill=True,
                          env=self._env)
        self.endpoint_url = f"http://127.0.0.1:{rgw_port}"
        self._wait_http(self.endpoint_url + "/", rgw, timeout_s)
        self._run("radosgw-admin", "user", "create", "--uid", KEY, "--display-name", KEY,
                  "--access-key", KEY, "--secret-key", SECRET)
        # The first bucket and object create RGW's data pools (seconds): do it now, not in a test.
        bucket = self.create_bucket()
        self.client().put_object(Bucket=bucket, Key="warm-up", Body=b"")


class AzureBlobServer(_Processes):
    """``tests/azure_blob_server.py`` in a child process: Azure Blob Storage over a folder, for
    adlfs (Azurite, the usual emulator, is npm only). Up in about 0.1 s.

    ``root`` holds one folder per container: files put there are blobs at once, and blobs written
    through the server land there. ``storage_options()`` is what adlfs (and pqloader) take;
    ``faults(503, "ServerBusy", 3)`` fails the next three GETs with Azure's error, and
    ``stats()`` counts the requests served, by method and by REST operation.
    """

    name = "azure"
    account = AZURE_ACCOUNT
    key = AZURE_KEY

    def __init__(self, root: str | os.PathLike[str] | None = None, *, verbose: bool = False,
                 timeout_s: float = 30) -> None:
        if importlib.util.find_spec("adlfs") is None:
            raise ServerUnavailable("adlfs is missing: pip install -e '.[test]' (or '.[azure]')")
        super().__init__()
        try:
            self.root = Path(root).resolve() if root is not None else self.dir / "root"
            self.root.mkdir(parents=True, exist_ok=True)
            script = Path(__file__).resolve().with_name("azure_blob_server.py")
            for attempt in range(3):
                self.port = free_port()
                args = [sys.executable, str(script), "--root", str(self.root),
                        "--port", str(self.port), *(["--verbose"] if verbose else [])]
                proc = self._spawn(args, "azure.log")
                try:
                    self._wait_http(f"{self.endpoint_url}/_control/stats", proc, timeout_s)
                    break
                except RuntimeError:
                    if attempt == 2 or "in use" not in self._log_tail():
                        raise
        except BaseException:
            self.close()
            raise

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def connection_string(self) -> str:
        """Azurite's form: path-style ``BlobEndpoint`` with the account, over plain HTTP."""
        return (f"DefaultEndpointsProtocol=http;AccountName={self.account};"
                f"AccountKey={self.key};BlobEndpoint={self.endpoint_url}/{self.account};")

    def storage_options(self) -> dict[str, Any]:
        """Keyword arguments for ``adlfs.AzureBlobFileSystem`` (and pqloader's
        ``storage_options``)."""
        return {"connection_string": self.connection_string}

    def create_container(self, container: str | None = None) -> str:
        """Create ``container`` (default: a new unique name) and return its name."""
        container = container or f"pq-{uuid.uuid4().hex[:16]}"
        (self.root / container).mkdir()
        return container

    def upload_dir(self, local: str | os.PathLike[str], container: str | None = None,
                   prefix: str = "") -> str:
        """Copy every file under ``local`` to ``container/prefix`` (straight into ``root``);
        return ``az://container/prefix``. With no ``container`` a new one is made."""
        container = container or self.create_container()

        def put(path: Path, key: str) -> None:
            (self.root / container / key).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, self.root / container / key)

        return f"az://{container}/{_upload_tree(local, prefix, put)}"

    def _control(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.endpoint_url}/_control/{path}", data=data,
                                     method="GET" if data is None else "POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            out: dict[str, Any] = json.loads(resp.read())
        return out

    def faults(self, status: int, code: str, count: int,
               methods: tuple[str, ...] = ("GET",)) -> dict[str, Any]:
        """Fail the next ``count`` requests whose method is in ``methods`` with ``status`` and
        Azure's XML error for ``code`` (``count=0`` clears it); return the switch as set."""
        return self._control("faults", {"status": status, "code": code, "count": count,
                                        "methods": list(methods)})

    def stats(self) -> dict[str, Any]:
        """Requests served so far: ``requests`` by method, ``operations`` by REST name
        (``GetBlob``, ``ListBlobs``...), ``faults_served`` and ``faults_pending``."""
        return self._control("stats")


@contextlib.contextmanager
def _serve(kind: str, arg: str | None) -> Iterator[str]:
    if kind == "moto":
        with MotoS3() as s3:
            yield f"{s3.endpoint_url}  storage_options={s3.storage_options}"
    elif kind == "rgw":
        with RadosGateway() as rgw:
            yield f"{rgw.endpoint_url}  storage_options={rgw.storage_options}"
    elif kind == "gcs":
        with GcsEmulator() as gcs:
            yield (f"{gcs.endpoint_url}  storage_options={gcs.storage_options}  "
                   "(with GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false in the client's environment)")
    elif kind == "http" and arg:
        with NginxFiles(arg) as http:
            yield http.url
    else:
        raise SystemExit("usage: python tests/servers.py moto|rgw|gcs|http DIR")


if __name__ == "__main__":
    started = time.perf_counter()
    args = [*sys.argv[1:], "", ""]
    with _serve(args[0], args[1] or None) as info:
        print(f"up in {time.perf_counter() - started:.1f} s: {info}  (Ctrl-C stops)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
