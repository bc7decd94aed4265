"""Filesystems for remote data: made in the process that uses them, with retries pqloader owns.

A :class:`Store` is a picklable description of where a dataset lives (an fsspec protocol and its
``storage_options``, or a filesystem the user built). The live filesystem is created on first use
in each process, never inherited across ``fork``: fsspec's async filesystems (s3fs, gcsfs) hang
in a forked child that reuses its parent's event loop.

Every request goes through :meth:`Store.read_ranges`: byte ranges are coalesced, split into
parts that fetch in parallel, retried with exponential backoff and full jitter when the error is
transient (503 SlowDown, 429, 500, resets, timeouts), and bounded by an adaptive concurrency
limit that halves under throttling and creeps back up on success. Each request, retry and
throttle is counted in :class:`IOStats`.
"""

from __future__ import annotations

import os
import random
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from ._arrowfs import ArrowFs, is_arrow_fs
from ._backends import if_match, own_retries, set_retries
from ._errors import InvalidArgumentError, RemoteIOError
from ._iostats import IOStats
from ._ranges import Range, coalesce, cut
from ._retry import (
    Abandoned,
    Limiter,
    RangeIgnored,
    RetryPolicy,
    ShortRead,
    classify,
    pause,
    remote_error,
    stopped,
    with_timeout,
)
from ._signed import has_secret
from ._threads import executor
from ._versions import same_version, version_of

# Extras that provide each protocol, for the install hint when one is missing.
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure",
           "abfss": "azure", "adl": "azure", "http": "http", "https": "http"}


def split_url(source: str) -> tuple[str, str]:
    """``("s3", "bucket/prefix")`` for ``"s3://bucket/prefix"``; ``("file", path)`` otherwise."""
    protocol, sep, rest = source.partition("://")
    if not sep:
        return "file", source
    return protocol.lower(), rest


def lower_scheme(source: Any) -> Any:
    """A URL's scheme in lower case, as fsspec knows it (schemes are case-insensitive: ``S3://b``
    was read as a bucket named ``S3:``, found in review); lists too; anything else as given."""
    if isinstance(source, (list, tuple)):
        return type(source)(lower_scheme(s) for s in source)
    if isinstance(source, str) and (cut := source.find("://")) > 0 \
            and not source[:cut].islower() and source[:cut].isalnum():
        return source[:cut].lower() + source[cut:]
    return source


def is_remote(source: object) -> bool:
    """True for a URL that is not ``file://``."""
    return isinstance(source, str) and "://" in source and not source.startswith("file://")


def make_store(source: object, storage_options: dict[str, Any] | None, filesystem: Any,
               retry: RetryPolicy | None) -> Store | None:
    """The store a source is read through, or ``None`` for local files."""
    if filesystem is not None:
        if storage_options:
            raise InvalidArgumentError("pass storage_options or filesystem, not both: "
                                       "configure the filesystem itself")
        proto = getattr(filesystem, "protocol", None)
        proto = proto[0] if isinstance(proto, (tuple, list)) else proto
        return Store(str(proto or ""), filesystem=filesystem, retry=retry)
    items = [os.fspath(i) if isinstance(i, os.PathLike) else i for i in (
        source if isinstance(source, (list, tuple)) else [source])]
    remote = {split_url(i)[0] for i in items if isinstance(i, str) and is_remote(i)}
    if not remote:
        if storage_options:
            raise InvalidArgumentError(
                f"storage_options were given but {source!r} is a local path; pass a URL "
                "such as s3://bucket/prefix/")
        return None
    if len(remote) > 1 or any(not is_remote(i) for i in items):
        raise InvalidArgumentError(f"the sources mix filesystems ({sorted(remote)} and "
                                   "others); open one dataset per filesystem")
    return Store(remote.pop(), storage_options, retry=retry)


# Filesystems made (or given) in this process, forgotten by a forked child: their
# finalizers, run when the child collects its copy, closed the parent's sessions from there
# on an event loop no thread of the child runs, and asyncio printed "Task exception was
# never retrieved ... attached to a different loop" (s3fs under process workers with a
# cache; found in review). The child makes its own (Store.fs). Kept by id: fsspec
# filesystems of equal options are equal, and a set kept one of them.
_MADE: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
# In the child, the parent's are kept, never collected: aiohttp warned of each "Unclosed
# client session" they had open.
_INHERITED: list[Any] = []


def _forget_inherited() -> None:
    _INHERITED.extend(_MADE.values())
    inherited = {id(fs) for fs in _INHERITED}
    registry: dict[Any, Any] = getattr(weakref.finalize, "_registry", {})
    for finalizer in list(registry):
        info = finalizer.peek()
        if info is not None and id(info[0]) in inherited:
            finalizer.detach()
    _MADE.clear()


os.register_at_fork(after_in_child=_forget_inherited)


# -- the store ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ObjectInfo:
    path: str  # without the protocol
    size: int
    version: str | None  # ETag, generation or mtime: a changed object gets a new one


class Store:
    """Where a remote dataset lives; picklable, its filesystem made anew in each process."""

    def __init__(self, protocol: str, storage_options: dict[str, Any] | None = None, *,
                 filesystem: Any = None, retry: RetryPolicy | None = None,
                 stats: IOStats | None = None) -> None:
        self.protocol = protocol
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self._user_fs = filesystem  # a pre-built fsspec or pyarrow.fs filesystem, or None
        self._user_pid = os.getpid()  # where it was built
        self.stats = stats if stats is not None else IOStats()  # shared with worker processes
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._fs: Any = None
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self.limiter = Limiter(self.retry.max_concurrency)

    def __getstate__(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "storage_options": self.storage_options,
                "retry": self.retry, "fs": self._user_fs, "stats": self.stats}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["protocol"], state["storage_options"],  # type: ignore[misc]
                      filesystem=state["fs"], retry=state["retry"], stats=state["stats"])

    def url(self, path: str) -> str:
        """The URL of a filesystem path (what users and error messages see), in the scheme the
        dataset was opened with: adlfs would write ``abfs://`` for ``az://``."""
        url = str(self.fs.unstrip_protocol(path))
        scheme, sep, rest = url.partition("://")
        names = getattr(self.fs, "protocol", ())
        names = (names,) if isinstance(names, str) else tuple(names)
        if sep and scheme != self.protocol and {scheme, self.protocol} <= set(names):
            return f"{self.protocol}://{rest}"
        return url

    def native(self, url: str) -> str:
        """The filesystem's own path for a URL (s3://b/k -> b/k; http URLs stay whole)."""
        return str(self.fs._strip_protocol(url))

    # the live filesystem, per process
    @property
    def fs(self) -> Any:
        if self._pid != os.getpid():  # forked: nothing of the parent's IO state is usable
            self._reset()
        if self._fs is None:
            with self._lock:
                if self._fs is None:
                    self._fs = self._make()
        return self._fs

    def _make(self) -> Any:
        user = self._user_fs
        if user is not None:
            if is_arrow_fs(user):
                return ArrowFs(user)
            if self._pid != self._user_pid and hasattr(user, "storage_args"):
                # An fsspec filesystem built in another process (before a fork): make a
                # fresh one from its arguments, as its event loop and sessions are not ours.
                user = type(user)(*user.storage_args,
                                  **{**user.storage_options, "skip_instance_cache": True})
                _MADE[id(user)] = user
            return user
        try:
            import fsspec
        except ImportError as exc:  # pragma: no cover - fsspec comes with the remote extras
            raise ImportError(_hint(self.protocol)) from exc
        options = own_retries(self.protocol, self.storage_options, self.retry.timeout_s)
        try:
            cls = fsspec.get_filesystem_class(self.protocol)
        except (ImportError, ValueError) as exc:
            raise ImportError(f"{_hint(self.protocol)} ({exc})") from exc
        retries = options.pop("retries", None)
        try:
            fs = cls(skip_instance_cache=True, **options)  # not shared: its retries are ours
        except Exception as exc:  # adlfs without an account: a bare ValueError, found in review
            raise RemoteIOError(
                f"{self.protocol}://: its filesystem ({cls.__name__}) could not be made: "
                f"{type(exc).__name__}: {exc}; check storage_options (credentials, account, "
                "endpoint) or the environment they come from") from exc
        if retries is not None:
            set_retries(self.protocol, fs, retries)
        _MADE[id(fs)] = fs
        return fs

    def _executor(self) -> ThreadPoolExecutor:
        _ = self.fs  # resets after fork
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = executor(self.retry.max_concurrency, "pqloader-io")
        return self._pool

    # listing
    def info(self, path: str) -> ObjectInfo:
        return self.info_and_type(path)[0]

    def info_and_type(self, path: str) -> tuple[ObjectInfo, str | None]:
        """The object's info, and its media type where the filesystem tells (HTTP's
        Content-Type: ``text/html`` for a folder's index page)."""
        info = self._call(lambda: self.fs.info(path), path)
        mimetype = info.get("mimetype")
        return _object_info(info), str(mimetype).partition(";")[0] if mimetype else None

    def find(self, path: str) -> list[ObjectInfo]:
        """Every object below ``path`` (recursively), or ``path`` itself if it is an object;
        folder markers left out (:func:`_no_markers`)."""
        found = self._call(lambda: self.fs.find(path, detail=True, withdirs=False), path,
                           timeout_s=self.retry.list_timeout_s)
        objects = _no_markers([_object_info(i) for i in found.values() if i], path)  # ({}:
        return sorted(objects, key=lambda o: o.path)  # fsspec's HTTP lists an empty folder so)

    def glob(self, pattern: str) -> list[ObjectInfo]:
        """The objects ``pattern`` matches, and those below the folders it matches (Spark's
        ``out/b.parquet/`` is a folder of files: its rows were left out, found in review)."""
        found = self._call(lambda: self.fs.glob(pattern, detail=True), pattern,
                           timeout_s=self.retry.list_timeout_s)
        objects = {o.path: o for o in _no_markers(
            [_object_info(i) for i in found.values() if i.get("type") != "directory"])}
        for name in sorted(n for n, i in found.items() if i.get("type") == "directory"):
            objects.update((o.path, o) for o in self.find(name))  # "**" matched them too
        return sorted(objects.values(), key=lambda o: o.path)

    def isdir(self, path: str) -> bool:
        return bool(self._call(lambda: self.fs.isdir(path), path))

    def exists(self, path: str) -> bool:
        return bool(self._call(lambda: self.fs.exists(path), path))

    # reading
    def read_ranges(self, path: str, ranges: Sequence[Range],
                    version: str | None = None) -> dict[Range, bytes]:
        """The bytes of each range (coalesced, parallel, retried): ``{(offset, length): data}``.
        ``version``: the object's when the dataset opened; where the server can tell, a read
        of another version fails, the object changed."""
        return {r: b"".join(parts) if len(parts) != 1 else parts[0]
                for r, parts in self.read_pieces(path, ranges, version).items()}

    def read_pieces(self, path: str, ranges: Sequence[Range],
                    version: str | None = None) -> dict[Range, list[bytes]]:
        """Like :meth:`read_ranges`, but each range as the consecutive pieces it was fetched
        in, not joined: a caller that writes them out saves a copy."""
        if not ranges:
            return {}
        pieces = coalesce(ranges, self.retry.hole_bytes, self.retry.part_bytes)
        pool = self._executor()
        cancel = threading.Event()  # set when this caller stops waiting: the rest stop too
        futures = {p: pool.submit(self._get, path, p, version, cancel) for p in pieces}
        try:
            fetched = {p: f.result() for p, f in futures.items()}
        except BaseException:  # a piece's error, Ctrl-C: no retries left running for nothing
            cancel.set()
            for future in futures.values():
                future.cancel()
            raise
        return {r: cut(fetched, r) for r in ranges}

    def read(self, path: str, offset: int, length: int) -> bytes:
        return self.read_ranges(path, [(offset, length)])[(offset, length)]

    def _get(self, path: str, piece: Range, version: str | None = None,
             cancel: threading.Event | None = None) -> bytes:
        off, n = piece
        fs = self.fs
        get = if_match(fs, path, off, off + n, version) or (
            lambda: fs.cat_file(path, start=off, end=off + n))
        data: bytes = self._call(get, path, expect=n, count=True, cancel=cancel,
                                 version=version)
        return data

    def _replaced(self, path: str, version: str | None) -> bool:
        """Whether the object is now another version than ``version`` (a short read of a
        filesystem that cannot ask for one: GCS, Azure, ``pyarrow.fs``). Its short reads were
        retried as cut short, then told to raise the attempts (found in review)."""
        if version is None:
            return False
        fs = self.fs
        try:
            if hasattr(fs, "invalidate_cache"):  # s3fs and gcsfs answer info() from listings
                fs.invalidate_cache(path)
            info = with_timeout(lambda: fs.info(path), self.retry.timeout_s)
        except Exception:  # one look only: the read's own retries and error say the rest
            return False
        return not same_version(_object_info(info).version, version)

    def _call(self, fn: Callable[[], Any], path: str, *, expect: int | None = None,
              count: bool = False, timeout_s: float | None = None,
              cancel: threading.Event | None = None, version: str | None = None) -> Any:
        """``fn()`` with retries, backoff, the concurrency limit and a per-request timeout
        (``timeout_s``: the policy's per request, unless given); given up at once
        (:class:`Abandoned`) when ``cancel`` is set or the interpreter exits. A read short of
        ``expect`` bytes fails at once if the object is no longer ``version``."""
        policy = self.retry
        for attempt in range(policy.attempts):
            try:
                if stopped(cancel):
                    raise Abandoned("the reads' caller is gone")
                with self.limiter:
                    data = with_timeout(fn, policy.timeout_s if timeout_s is None
                                        else timeout_s, cancel)
                if expect is not None and len(data) < expect:
                    raise ShortRead(f"short read: {len(data)} of {expect} bytes")
                if expect is not None and len(data) > expect:
                    raise RangeIgnored(
                        f"asked for {expect} bytes, got {len(data)}: the server ignores "
                        "HTTP Range requests and sends the whole object; serve the files "
                        "from a server that honours Range (nginx, S3, GCS and Azure do)")
            except Abandoned:
                raise
            except Exception as exc:  # not BaseException: Ctrl-C stops, it is no IO error
                if isinstance(exc, ShortRead) and self._replaced(path, version):
                    raise RemoteIOError(
                        f"{self.url(path)}: the object was replaced since the dataset was "
                        f"opened ({exc}: it is now another version); open the dataset "
                        "again") from None
                kind = "transient" if isinstance(exc, FutureTimeout) else classify(exc)
                if kind == "fatal" or attempt + 1 == policy.attempts:
                    url = self.url(path)
                    error = remote_error(url, exc, attempt + 1, kind)
                    if has_secret(url):  # the cause's text holds the secret: its
                        raise error from None  # gist is in the (redacted) message already
                    raise error from exc
                if kind == "throttled":
                    self.limiter.throttled()
                self.stats.add(retries=1, throttled=int(kind == "throttled"),
                               timeouts=int(isinstance(exc, FutureTimeout)))
                cap = min(policy.max_delay_s, policy.base_delay_s * 2**attempt)
                pause(random.uniform(0, cap), cancel)
                continue
            self.limiter.succeeded()
            if count:
                self.stats.add(requests=1, bytes=len(data))
            self.stats.concurrency = self.limiter.limit
            return data
        raise AssertionError("unreachable")  # pragma: no cover


def _hint(protocol: str) -> str:
    extra = _EXTRAS.get(protocol)
    pkg = f"pip install 'pqloader[{extra}]'" if extra else "install the fsspec implementation"
    return f"reading {protocol}:// needs an fsspec filesystem for it: {pkg}"


def _no_markers(objects: list[ObjectInfo], root: str = "") -> list[ObjectInfo]:
    """``objects`` less the empty objects that stand for folders: S3's ``x/`` (the console's
    "Create folder"; s3fs lists it as ``x``) and Hadoop's ``x_$folder$``. A dataset with one
    failed to open: "0 bytes is too short for a Parquet file" of a folder (found in review)."""
    folders = {root.rstrip("/")}
    for o in objects:
        parts = o.path.split("/")
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return [o for o in objects if not o.path.endswith("_$folder$") and not (
        o.size == 0 and (o.path.endswith("/") or o.path.rstrip("/") in folders))]


def _object_info(info: dict[str, Any]) -> ObjectInfo:
    """An fsspec ``info`` dict as an :class:`ObjectInfo` (its version: ``_versions.py``)."""
    name = str(info.get("name") or info.get("Key") or "")
    size = int(info.get("size") or info.get("Size") or 0)
    return ObjectInfo(name, size, version_of(info, size))
