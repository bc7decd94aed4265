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
from typing import Any

_AZURE = ("az", "abfs", "abfss")


def own_retries(protocol: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with the backend's own retries turned off, unless the user set them.

    ``retries`` is left in for :func:`set_retries` where it is no option of the backend's.
    """
    options = dict(options)
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
