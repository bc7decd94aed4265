"""A local file as its dataset opened it (inode and modification time), checked at each read.

A file replaced (``write_dataset(overwrite=True)`` renames new files into place) or rewritten
at the same size and row counts after its dataset was opened was read as it was then, its
rows mixed with the old ones' without a word (found in review). Remote objects have their
version for that (``If-Match`` an ETag); a local file has its stamp, one ``stat`` a read.

A stamp holds the machine (and boot) it was taken on: a dataset pickled to another machine
with its own copy of the files at the same path (``broadcast_object_list``, Ray) is not
checked there, where every inode differs (found in review); its worker processes, on the
same machine, are.
"""

from __future__ import annotations

import os
import socket

from ._errors import SchemaMismatchError

Stamp = tuple[str, int, int]  # (machine, st_ino, st_mtime_ns)


def _machine() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:  # Linux: this machine, this boot
            return f.read().strip()
    except OSError:
        return socket.gethostname()


_MACHINE = _machine()


def stamp_of(st: os.stat_result) -> Stamp:
    return _MACHINE, st.st_ino, st.st_mtime_ns


def check_unchanged(path: str, stamp: Stamp | None, size: int, changed: str) -> None:
    """Raise if the file at ``path`` is no longer the one stamped ``stamp`` (of ``size``
    bytes); ``changed`` says what to do. A file gone is left to the read to tell."""
    if stamp is None or stamp[0] != _MACHINE:
        return
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if stamp_of(st) != stamp or st.st_size != size:
        how = f"{st.st_size:,} bytes, {size:,} when opened" if st.st_size != size else \
            "its inode or modification time changed"
        raise SchemaMismatchError(
            f"{path} was replaced or rewritten since the dataset was opened ({how}): its "
            f"rows would mix two versions of the data; {changed}")
