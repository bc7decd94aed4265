"""Shared fixtures: datasets made on the fly in temporary folders; real servers on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pytest
import servers

import pqloader

# Recent gcsfs (2026.10) asks each bucket's layout from GCS's Storage Control API over gRPC,
# which the GCS emulator does not serve: each call would retry that for 60 s. gcsfs reads this
# switch when it is imported, so it is set here, before anything imports gcsfs; worker processes
# inherit it.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

MakeDataset = Callable[..., Path]
ServerT = TypeVar("ServerT", bound=servers._Processes)


@pytest.fixture
def make_dataset(tmp_path: Path) -> MakeDataset:
    """Write a dataset with an ``id`` column 0..rows-1 and a few typed columns; return its path."""
    count = 0

    def make(rows: int = 1000, *, rows_per_file: int = 300, row_group_size: int = 100,
             name: str | None = None, extra: bool = True) -> Path:
        nonlocal count
        count += 1
        path = tmp_path / (name or f"ds{count}")
        rng = np.random.default_rng(rows)
        columns: dict[str, object] = {"id": np.arange(rows, dtype=np.int64)}
        if extra:
            columns["x"] = rng.random(rows, dtype=np.float32)
            columns["tokens"] = pa.array(
                [list(range(i % 5)) for i in range(rows)], pa.list_(pa.int32())
            )
            columns["text"] = [f"row {i}" for i in range(rows)]
        pqloader.write_dataset(pa.table(columns), path, rows_per_file=rows_per_file,
                               row_group_size=row_group_size)
        return path

    return make


@pytest.fixture
def run_bench(tmp_path: Path) -> Callable[[str], dict[str, object]]:
    """Run ``benchmarks/NAME.py --tiny`` in a child process; return its ``RESULT`` JSON."""

    def run(name: str) -> dict[str, object]:
        script = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
        proc = subprocess.run(
            [sys.executable, str(script), "--tiny", "--data", str(tmp_path / "data")],
            capture_output=True, text=True, timeout=600,
        )
        assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert len(lines) == 1, proc.stdout
        result: dict[str, object] = json.loads(lines[0].removeprefix("RESULT "))
        return result

    return run


# --- Real servers on loopback for remote IO (issue 5): the servers themselves are in servers.py.
# A server whose binaries are missing skips its tests, with the install command in the reason;
# with PQLOADER_REQUIRE_SERVERS=1 (set by .ci/run) it fails them instead, so CI never skips a tier.


def _start_or_skip(factory: Callable[..., ServerT], *args: object, **kwargs: object) -> ServerT:
    try:
        return factory(*args, **kwargs)
    except servers.ServerUnavailable as exc:
        if os.environ.get("PQLOADER_REQUIRE_SERVERS"):
            pytest.fail(f"{exc} (PQLOADER_REQUIRE_SERVERS is set)", pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[servers.MotoS3]:
    """``moto_server`` on 127.0.0.1 for the whole session (up in ~0.5 s).

    Yields a :class:`servers.MotoS3`: ``endpoint_url``, ``storage_options`` for s3fs and
    pqloader, ``upload_dir(path, bucket=None, prefix="") -> "s3://bucket/prefix"`` (a new bucket
    per call unless one is named), ``create_bucket()``, ``client()`` (boto3).
    """
    with _start_or_skip(servers.MotoS3) as server:
        yield server


@pytest.fixture(scope="session")
def rgw_s3() -> Iterator[servers.RadosGateway]:
    """Ceph's RADOS Gateway (a real S3) on a throwaway one-OSD cluster; ~3 s to start.

    Same interface as ``moto_s3``. Skipped where the Ceph packages are absent.
    """
    with _start_or_skip(servers.RadosGateway) as server:
        yield server


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[servers.GcsEmulator]:
    """``gcp-storage-emulator`` on 127.0.0.1 for the whole session (in memory, up in ~0.5 s).

    Yields a :class:`servers.GcsEmulator`: ``endpoint_url``, ``storage_options`` for gcsfs and
    pqloader, ``upload_dir(path, bucket=None, prefix="") -> "gs://bucket/prefix"`` (a new bucket
    per call unless one is named), ``upload_file(path, bucket, key)``, ``create_bucket()``.
    """
    with _start_or_skip(servers.GcsEmulator) as server:
        yield server


@pytest.fixture(scope="session")
def azure_blob() -> Iterator[servers.AzureBlobServer]:
    """Azure Blob Storage (``tests/azure_blob_server.py``) on 127.0.0.1 for the whole session,
    over a temporary folder; up in ~0.1 s. Skipped where adlfs is not installed.

    Yields a :class:`servers.AzureBlobServer`: ``root`` (one folder per container),
    ``connection_string``, ``storage_options()`` for adlfs and pqloader, ``create_container()``,
    ``upload_dir(path, container=None, prefix="") -> "az://container/prefix"``, and the fault
    switch ``faults(status, code, count, methods=("GET",))`` with ``stats()``. The switch is
    shared by the session: a test that sets it clears it (``count=0``) when done.
    """
    with _start_or_skip(servers.AzureBlobServer) as server:
        yield server


@pytest.fixture(scope="session", params=["moto", "rgw"])
def s3_server(request: pytest.FixtureRequest) -> servers.S3Server:
    """Each S3 tier in turn: a test using it runs against moto and against Ceph's RGW."""
    server: servers.S3Server = request.getfixturevalue(f"{request.param}_s3")
    return server


def _proxies(cls: Callable[..., ServerT], default: object) -> Iterator[Callable[..., ServerT]]:
    """A factory of fault proxies of ``cls`` in front of ``upstream`` (``default`` if none),
    each stopped after the test."""
    with contextlib.ExitStack() as stack:

        def make(upstream: object = None, **faults: Any) -> ServerT:
            return stack.enter_context(_start_or_skip(cls, upstream or default, **faults))

        yield make


@pytest.fixture
def s3_proxy(moto_s3: servers.MotoS3) -> Iterator[Callable[..., servers.S3FaultProxy]]:
    """Factory for nginx fault injectors in front of an S3 server (``moto_s3`` by default).

    ``proxy = s3_proxy(upstream=None, rate_per_s=None, burst=0, latency_ms=0,
    drop_fraction=0.0)`` yields a :class:`servers.S3FaultProxy` with its own ``endpoint_url`` and
    ``storage_options`` over the upstream's buckets; ``proxy.upload_dir`` uploads straight to the
    upstream, past the faults. Every proxy is stopped after the test.
    """
    yield from _proxies(servers.S3FaultProxy, moto_s3)


@pytest.fixture
def gcs_proxy(gcs_emulator: servers.GcsEmulator) -> Iterator[Callable[..., servers.GcsFaultProxy]]:
    """Factory for nginx fault injectors in front of the GCS emulator: like ``s3_proxy``, and
    ``status=503`` (429; 403 for an error never to retry) for what a throttled request gets,
    with GCS's JSON error body."""
    yield from _proxies(servers.GcsFaultProxy, gcs_emulator)


@pytest.fixture
def http_server(nginx_files: Callable[[str | os.PathLike[str]], servers.NginxFiles]
                ) -> Callable[[str | os.PathLike[str]], str]:
    """Serve a directory over HTTP with nginx: ``base_url = http_server(path)``.

    Files are at ``f"{base_url}/{name}"``; range requests work and ``f"{base_url}/"`` is an HTML
    index that fsspec's HTTP filesystem lists. Every server is stopped after the test.
    """
    return lambda directory: nginx_files(directory).url


@pytest.fixture
def nginx_files() -> Iterator[Callable[[str | os.PathLike[str]], servers.NginxFiles]]:
    """nginx serving directories (``serve(path)``), each stopped after the test; its log of
    requests is ``settled_requests()``; :func:`http_server` gives its URL alone."""
    with contextlib.ExitStack() as stack:

        def serve(directory: str | os.PathLike[str]) -> servers.NginxFiles:
            return stack.enter_context(_start_or_skip(servers.NginxFiles, directory))

        yield serve
