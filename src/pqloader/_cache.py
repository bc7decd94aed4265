"""A local cache of remote bytes, shared by every worker and process of a node.

An entry is one byte range of one version of one remote object: a footer's tail, or the
projected column chunks of one row group, coalesced into one range (see ``_read.py``). Its file
name is a hash of (URL, version, offset, length), so a path can never leave the cache directory,
and a changed object (new ETag or size) is a different entry: never served stale. Entries are
written to a temporary file and renamed into place (atomic: readers see a whole entry or none),
read back memory-mapped (no copy: pyarrow decodes straight from the page cache), carry a
checksum that is checked on every read (a corrupt entry is deleted and fetched again), and are
evicted oldest-used first when the cache outgrows ``max_bytes``, by one process at a time under
a file lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import numbers
import os
import shutil
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ._cache_files import (
    TEMPORARY,
    CacheEntry,
    Survey,
    entry_files,
    entry_folders,
    scan,
    survey,
)
from ._entry import Buffer, CorruptCacheEntry, decode, write
from ._errors import InvalidArgumentError
from ._layouts import old_layouts, tree_bytes
from ._signed import unsigned

__all__ = ["Buffer", "Cache", "CacheEntry", "CorruptCacheEntry", "Survey"]

# A new entry format gets a new folder; old ones are left alone. v1: one entry per column
# chunk, read into Python bytes. v2: one entry per coalesced row-group range, memory-mapped.
_LAYOUT = "v2"
_EVICT_TO = 0.9  # eviction frees down to this share of max_bytes
_CLEAR_TEMPORARIES_S = 60  # clear() deletes temporary files older than this
_FULL_RETRY_S = 10.0  # a full disk makes a process evict at most this often


class Cache:
    """A directory of cached remote byte ranges, safe to share between processes and jobs.

    Args:
        directory: where entries live (created if missing). Several jobs may share it.
        max_bytes: evict least recently used entries beyond this size; ``None`` keeps all.

    Pass it as ``ParquetDataset(url, cache=pqloader.Cache("/local/ssd/pqcache", 50e9))``.
    """

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int | float | None = None
                 ) -> None:
        if max_bytes is not None and (isinstance(max_bytes, (bool, np.bool_)) or not isinstance(
                max_bytes, numbers.Real) or not 1 <= max_bytes < 2**63):  # nor nan, nor inf
            raise InvalidArgumentError(f"Cache max_bytes must be a number of bytes >= 1 (e.g. "
                                       f"50e9), or None for no limit; got {max_bytes!r}")
        self.directory = Path(directory).expanduser()  # not a folder named "~" (review)
        self.max_bytes = None if max_bytes is None else int(max_bytes)
        self._root = self.directory / _LAYOUT
        self._reset()

    def _reset(self) -> None:
        """This process's bookkeeping: made anew after a fork (a lock held by another thread
        of the parent at the fork would never be released in the child)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._used: int | None = None  # bytes on disk, as last counted plus our own puts
        self._unsynced = 0  # bytes this process wrote since it last counted the disk
        self._warned = False  # a failed write was reported
        self._warned_evict = False  # ... a failed eviction
        self._full_at = -float("inf")  # when a full disk last made this process evict

    def __repr__(self) -> str:
        return f"Cache({str(self.directory)!r}, max_bytes={self.max_bytes})"

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory, "max_bytes": self.max_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["directory"], state["max_bytes"])  # type: ignore[misc]

    # -- entries ---------------------------------------------------------------------------
    def _path(self, url: str, version: str | None, offset: int, length: int) -> Path:
        key = json.dumps([url, version, offset, length]).encode()
        digest = hashlib.sha256(key).hexdigest()
        return self._root / digest[:2] / f"{digest}.pqc"

    def get(self, url: str, version: str | None, offset: int, length: int) -> pa.Buffer | None:
        """The cached bytes, memory-mapped, or ``None`` when absent. Raises
        :class:`CorruptCacheEntry` (after deleting it) when the entry fails its checks."""
        url = unsigned(url)  # a URL signed again hits; no signature is kept on disk
        path = self._path(url, version, offset, length)
        try:
            with pa.memory_map(str(path)) as f:
                raw = f.read_buffer()  # the mapping outlives the file handle and an unlink
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, pa.ArrowException):  # e.g. an empty file cannot be mapped
            raw = None
        payload = None if raw is None else decode(raw, url, version, offset, length)
        if payload is None:
            done = "deleted"
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError:  # a read-only cache, another user's entry: read past, not fatal
                done = "left in place (it cannot be deleted here)"
            raise CorruptCacheEntry(f"{path}: cache entry for {url} [{offset}, +{length}) is "
                                    f"damaged or unreadable; {done}, fetching it again")
        with contextlib.suppress(OSError):
            os.utime(path)  # last used: eviction goes by modification time
        return payload

    def put(self, url: str, version: str | None, offset: int, length: int,
            data: Buffer | Sequence[Buffer]) -> bool:
        """Store ``data`` (one buffer, or consecutive pieces written without joining them);
        atomic, so concurrent readers and writers see a whole entry or none.

        Best effort: a cache that cannot be written (read-only, full disk, a file where the
        folder should be) warns once per process and returns False; the data was fetched all
        the same, and reads go on without the cache.
        """
        if self._pid != os.getpid():
            self._reset()
        pieces = [data] if isinstance(data, (bytes, memoryview, pa.Buffer)) else list(data)
        size = sum(len(memoryview(p)) for p in pieces)
        if size != length:
            raise ValueError(f"cache put of [{offset}, +{length}) got {size} bytes")
        url = unsigned(url)
        path = self._path(url, version, offset, length)
        tmp = path.with_name(f".tmp-{os.getpid()}-{uuid.uuid4().hex}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                written = write(f, url, version, offset, length, pieces)
            os.replace(tmp, path)
        except BaseException as exc:  # Ctrl-C too: its temporary file was left, uncounted
            with contextlib.suppress(OSError):
                tmp.unlink()
            if not isinstance(exc, OSError):
                raise
            self._cannot_write(exc)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT) and self.max_bytes is not None:
                self._make_room()
            return False
        if self.max_bytes is not None:
            self._counting(lambda: self._account(written))
        return True

    def _cannot_write(self, exc: OSError) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"pqloader cache {self.directory} cannot be written ({exc}); "
                          "reading without it. Check the folder's permissions and free "
                          "space, or pass cache=None", RuntimeWarning, stacklevel=3)

    def _counting(self, count: Callable[[], object]) -> None:
        """Count the disk and evict (``count``), best effort: a folder gone meanwhile (deleted
        by hand) is no error, one that cannot be scanned or locked is warned of once."""
        try:
            count()
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._cannot_evict(exc)

    def _cannot_evict(self, exc: OSError) -> None:
        if not self._warned_evict:
            self._warned_evict = True
            warnings.warn(f"pqloader cache {self.directory} cannot evict ({exc}): it may grow "
                          f"past max_bytes={self.max_bytes}. Check the folder's permissions",
                          RuntimeWarning, stacklevel=3)

    def _make_room(self) -> None:
        """The disk is full: evict down to the budget now, not after a put that cannot
        succeed (a cache filled past ``max_bytes`` by a job with a larger one stayed so:
        review). At most once per ``_FULL_RETRY_S``: a disk filled by other files stays full."""
        now = time.monotonic()
        with self._lock:
            if now - self._full_at < _FULL_RETRY_S:
                return
            self._full_at = now
        self._counting(self.evict)

    def _account(self, written: int) -> None:
        """Count a put and evict when over ``max_bytes``. Other processes (workers, other
        jobs) write to the same folder unseen: the disk is counted again after every 1/16 of
        ``max_bytes`` written here, so the cache overshoots by about that per process."""
        assert self.max_bytes is not None
        with self._lock:
            recount = self._used is None or self._unsynced + written > self.max_bytes // 16
            self._unsynced = 0 if recount else self._unsynced + written
        if recount:
            used = self.usage()  # outside the lock: a scan of the whole folder
        with self._lock:
            if recount:
                self._used = used
            else:
                self._used = (self._used or 0) + written
            over = self._used > self.max_bytes
        if over:
            self.evict()

    # -- maintenance -----------------------------------------------------------------------
    def usage(self) -> int:
        """Bytes the cache's entries take on disk."""
        total = 0
        for entry in entry_files(self._root):
            with contextlib.suppress(FileNotFoundError):
                total += entry.stat().st_size
        return total

    def entries(self) -> list[CacheEntry]:
        """Every entry, least recently used first."""
        return self.survey().entries

    def survey(self) -> Survey:
        """One scan of the entry files (``pqloader cache du``): see :func:`survey`."""
        return survey(self._root)

    def evict(self, target: int | None = None, *, wait: bool = False) -> int:
        """Delete least recently used entries until the cache holds at most ``target`` bytes
        (default: 90% of ``max_bytes``). One process evicts at a time: while another does,
        this returns at once (``wait``: waits its turn); returns bytes freed."""
        if target is None:
            if self.max_bytes is None:
                return 0
            target = int(self.max_bytes * _EVICT_TO)
        if self.directory.exists() and not self.directory.is_dir():
            raise InvalidArgumentError(f"cache directory {self.directory} is not a folder")
        if not self._root.is_dir():
            return 0  # nothing cached (and a mistyped folder is not made)
        freed = 0
        with open(self._root / ".lock", "a+b") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                return 0  # another process is evicting right now
            try:
                files = []
                for entry in entry_files(self._root):
                    with contextlib.suppress(FileNotFoundError):
                        st = entry.stat()
                        files.append((st.st_mtime, st.st_size, entry.path))
                files.sort()
                used = sum(size for _, size, _ in files)
                for _, size, path in files:
                    if used <= target:
                        break
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                        used -= size
                        freed += size
                self._sweep_temporaries(3600 if target else _CLEAR_TEMPORARIES_S)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        with self._lock:
            self._used = used
        return freed

    def _sweep_temporaries(self, older_than_s: float) -> None:
        """Temporary files left by writers that died mid-write (a live one writes an entry
        in seconds; ``clear`` left them all, uncounted: found in review)."""
        cutoff = time.time() - older_than_s
        for sub in entry_folders(self._root):
            for entry in scan(sub.path):
                if TEMPORARY.fullmatch(entry.name):
                    with contextlib.suppress(OSError):
                        if entry.stat().st_mtime < cutoff:
                            os.unlink(entry.path)

    def old_layouts(self) -> dict[str, int]:
        """Folders of entries in another layout (``v1``: older pqloader versions) and the bytes
        each holds. This version never reads them; :meth:`clear` deletes them, eviction leaves
        them to the jobs that use them."""
        return old_layouts(self.directory, _LAYOUT)

    def clear(self) -> int:
        """Delete every entry, old layouts' too; returns bytes freed."""
        freed = self.evict(target=0, wait=True)  # not "0 freed" while a job evicts
        for name, size in self.old_layouts().items():
            shutil.rmtree(self.directory / name, ignore_errors=True)
            freed += size - tree_bytes(self.directory / name)  # what a writer kept, if any
        return freed
