"""One ``write_dataset`` at a time in a folder, and what killed ones left there cleaned up.

A write that is killed (SIGKILL, the OOM killer, a node lost) runs no handler: it leaves its
temporary file (``.part-00003.parquet.tmp-<uuid>``) and, when replacing a dataset, its
staging folder (``.pqloader-staging-<uuid>``) with every file it had finished. Readers skip
them (hidden names), so they were never read, and never removed either: a rerun after a kill
left the killed run's gigabytes beside the new dataset. Removing them is safe only when no
other write is using them, so a write holds an exclusive ``flock`` on ``.pqloader-writing``
in the folder while it runs: the kernel drops it when the process dies, however it dies, and a
second write into the same folder meanwhile is refused by name (two writes there replaced
each other's files). A write that succeeds removes them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from ._errors import InvalidArgumentError
from ._manifest import TMP_PREFIX as MANIFEST_TMP

LOCK = ".pqloader-writing"
STAGING_PREFIX = ".pqloader-staging-"
TMP_INFIX = ".tmp-"  # in ".part-00000.parquet.tmp-<uuid>"


@contextlib.contextmanager
def writing(root: Path) -> Iterator[bool]:
    """Hold ``root``'s write lock; whether it is held (not on a file system without locks,
    where nothing can tell a killed write's files from a running one's)."""
    path = root / LOCK
    fd = _lock(path, root)
    try:
        yield fd is not None
    finally:
        if fd is not None:
            path.unlink(missing_ok=True)  # before the unlock: a waiter then sees a new file
            os.close(fd)


def _lock(path: Path, root: Path) -> int | None:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise InvalidArgumentError(
                f"{root}: another write_dataset is writing into this folder (its process "
                f"holds {path.name}); wait for it to finish, or write into another folder"
            ) from None
        except OSError:  # no locks here (some network file systems)
            os.close(fd)
            path.unlink(missing_ok=True)
            return None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the write that held it ended and removed it meanwhile: lock anew


def remove_leftovers(root: Path) -> None:
    """Remove what killed writes left, once a write holding the lock has succeeded: not
    before, since a write refused, or failing, must not take the staging folder a failed
    swap left (the only copy of the new files the old ones were deleted for; found in
    review), and once one succeeds, the dataset they were for has been replaced."""
    for entry in root.iterdir():
        name = entry.name
        if name.startswith(STAGING_PREFIX) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.is_file() and (name.startswith(MANIFEST_TMP)  # (left for good: review)
                                  or (name.startswith(".part-") and TMP_INFIX in name)):
            entry.unlink(missing_ok=True)
