"""What each fsspec backend needs so that pqloader, not the backend, owns the retries.

Each backend retries failed requests its own way, unseen and uncounted by pqloader, and with
backoffs that compound with pqloader's: s3fs and botocore by options, gcsfs by a decorator fixed
on its class, the Azure SDK (under adlfs) by a policy object in its client's pipeline. On the
instances pqloader makes, each makes one attempt, unless the user's ``storage_options`` ask for
``retries=N`` (then the backend's own loop makes N attempts, and pqloader still retries what
gets through).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

_AZURE = ("az", "abfs", "abfss")


def own_retries(protocol: str, options: dict[str, Any], timeout_s: float = 60.0
                ) -> dict[str, Any]:
    """``options`` with the backend's own retries turned off, unless the user set them.

    ``retries`` is left in for :func:`set_retries` where it is no option of the backend's.
    ``timeout_s`` (the policy's per request): how long an HTTP request may wait on a server
    that does not answer, listings' too (aiohttp's own is 5 min a request: a listing of a
    server that stopped answering took the policy's ``attempts`` times that, found by
    fuzzing), unless the user set ``client_kwargs={"timeout": ...}``.
    """
    options = dict(options)
    if protocol in ("http", "https") and timeout_s > 0:
        import aiohttp  # fsspec's HTTP filesystem needs it

        client = dict(options.get("client_kwargs") or {})
        client.setdefault("timeout", aiohttp.ClientTimeout(
            total=None, sock_connect=min(10.0, timeout_s), sock_read=timeout_s))
        options["client_kwargs"] = client
    if protocol in ("s3", "s3a"):
        options.setdefault("retries", 1)
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})  # no retry
        config.setdefault("connect_timeout", 10)
        config.setdefault("read_timeout", 60)
        options["config_kwargs"] = config
    elif protocol in ("gs", "gcs", *_AZURE):
        options.setdefault("retries", 1)  # not an option of theirs: set_retries applies it
    return options


def set_retries(protocol: str, fs: Any, retries: int) -> None:
    """Make ``fs`` try each request ``retries`` times in all."""
    if hasattr(fs, "retries"):
        fs.retries = retries  # s3fs: its own retry loop, a class attribute
    if protocol in ("gs", "gcs"):
        _gcsfs_retries(fs, retries)
    elif protocol in _AZURE:
        _azure_retries(fs, retries)


def _gcsfs_retries(fs: Any, retries: int) -> None:
    """Make a gcsfs filesystem try each request ``retries`` times in all, on this instance only.

    Every call pqloader makes (listing, ``info``, ranged ``cat_file``) goes through gcsfs's
    ``self._request``, which the class wraps once, at its definition, in
    ``retry_request(retries=6)``: no option or attribute changes that. The wrapper keeps the
    plain method as ``__wrapped__``; bound to this instance, it shadows the class's, so other
    gcsfs filesystems in the process keep their retries. One attempt takes the plain method,
    not one wrapped anew: gcsfs logs each error it gives up on with a traceback, noise for
    every retry pqloader makes (and counts).
    """
    method = getattr(type(fs)._request, "__wrapped__", None)
    if method is None:  # pragma: no cover - a gcsfs that retries some other way
        return
    if retries > 1:
        from gcsfs.retry import retry_request

        method = retry_request(retries=retries)(method)
    fs._request = types.MethodType(method, fs)


def _azure_retries(fs: Any, retries: int) -> None:
    """Make an adlfs filesystem try each request ``retries`` times in all.

    azure-storage-blob retries a 503 or a reset itself (``ExponentialRetry``: 3 more attempts,
    15-27 s apart), and adlfs passes no option to the client it makes. The policy object
    sits in the pipeline of this instance's service client, which every blob and container
    client it derives shares: its count is set there, on this instance only.
    """
    client = getattr(fs, "service_client", None)
    policy = getattr(getattr(client, "_config", None), "retry_policy", None)
    if policy is not None and hasattr(policy, "total_retries"):
        policy.total_retries = max(0, retries - 1)


def if_match(fs: Any, path: str, start: int, end: int,
             version: str | None) -> Callable[[], bytes] | None:
    """A read of ``path``'s bytes ``start:end`` that the server refuses (412) unless the object
    is still ``version`` (its strong ETag), where ``fs`` can ask: fsspec's HTTP and s3fs. Else
    ``None``: a plain read (an object replaced while a dataset is open is then read as it is
    now, decoded with the footer of before, mixed with the cached bytes of before)."""
    etag = _strong_etag(version)
    if etag is None:
        return None
    kind = f"{type(fs).__module__}.{type(fs).__name__}"
    if kind == "fsspec.implementations.http.HTTPFileSystem":
        headers = {**(fs.kwargs.get("headers") or {}), "If-Match": etag}
        return lambda: bytes(fs.cat_file(path, start=start, end=end, headers=headers))
    if kind == "s3fs.core.S3FileSystem":
        return lambda: _s3_if_match(fs, path, start, end, etag)
    return None


def _strong_etag(version: str | None) -> str | None:
    """The ETag of a version (``_fs._object_info``'s), if strong: a weak one (``W/"..."``)
    never matches an If-Match."""
    if not version or not version.lower().startswith("etag="):
        return None
    etag = version[5:].rsplit(";size=", 1)[0]
    return etag if etag.startswith('"') and etag.endswith('"') and len(etag) > 2 else None


def _s3_if_match(fs: Any, path: str, start: int, end: int, etag: str) -> bytes:
    """s3fs's ranged ``get_object`` (its ``cat_file`` takes no If-Match), on its event loop."""
    from fsspec.asyn import sync

    bucket, key, version_id = fs.split_path(path)

    async def get() -> bytes:
        extra = {"VersionId": version_id} if version_id else {}
        response = await fs._call_s3("get_object", Bucket=bucket, Key=key, IfMatch=etag,
                                     Range=f"bytes={start}-{end - 1}", **extra)
        try:
            return bytes(await response["Body"].read())
        finally:
            response["Body"].close()

    data: bytes = sync(fs.loop, get)
    return data
