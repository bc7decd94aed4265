"""A local file as its dataset opened it (inode and modification time), checked at each read.

A file replaced (``write_dataset(overwrite=True)`` renames new files into place) or rewritten
at the same size and row counts after its dataset was opened was read as it was then, its
rows mixed with the old ones' without a word (found in review). Remote objects have their
version for that (``If-Match`` an ETag); a local file has its stamp, one ``stat`` a read.
"""

from __future__ import annotations

import os

from ._errors import SchemaMismatchError

Stamp = tuple[int, int]  # (st_ino, st_mtime_ns)


def stamp_of(st: os.stat_result) -> Stamp:
    return st.st_ino, st.st_mtime_ns


def check_unchanged(path: str, stamp: Stamp | None, size: int, changed: str) -> None:
    """Raise if the file at ``path`` is no longer the one stamped ``stamp`` (of ``size``
    bytes); ``changed`` says what to do. A file gone is left to the read to tell."""
    if stamp is None:
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
