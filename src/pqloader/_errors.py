"""The exception tree: every error pqloader raises for bad input.

::

    PQLoaderError
    ├── DatasetNotFoundError   (FileNotFoundError)  a path that does not exist
    ├── EmptyDatasetError      (FileNotFoundError)  no Parquet files, or no row the filter keeps
    ├── CorruptFileError       (OSError)            not Parquet, truncated, or a corrupt page
    ├── PermissionDeniedError  (PermissionError)    a file or folder this process may not read
    ├── SchemaMismatchError    (ValueError)         two files disagree on a column
    ├── ColumnNotFoundError    (KeyError)           a column asked for that the data lacks
    ├── InvalidArgumentError   (ValueError)         an argument out of range
    ├── DataError              (ValueError)         values no batch or filter can take
    ├── StateMismatchError     (ValueError)         a saved state of another dataset or settings
    ├── LoaderTimeoutError     (TimeoutError)       no batch within ``timeout`` seconds
    ├── IncompleteEpochError   (RuntimeError)       a batch asked of a pass an error ended
    └── RemoteIOError          (OSError)            a remote read that failed for good

Each message names the file, row group, column or argument at fault and says what to do.
"""

from __future__ import annotations

import errno
import os
import stat
import sys

from ._signed import redact


class PQLoaderError(Exception):
    """Base of every error pqloader raises for bad input or bad data. A signed URL in its
    message shows no secret (``_signed.redact``): messages end up in logs."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class DatasetNotFoundError(PQLoaderError, FileNotFoundError):
    """A path given as the source does not exist."""


class EmptyDatasetError(PQLoaderError, FileNotFoundError):
    """A directory, glob or list that holds no Parquet file, or no row its filter keeps."""


class CorruptFileError(PQLoaderError, OSError):
    """A file that is not Parquet, is truncated, or has a page that does not decode."""


class PermissionDeniedError(PQLoaderError, PermissionError):
    """A local file or folder of the dataset that this process is not allowed to read."""


class SchemaMismatchError(PQLoaderError, ValueError):
    """Two files of one dataset disagree on a column's presence or type."""


class ColumnNotFoundError(PQLoaderError, KeyError):
    """A column was asked for that the dataset does not have."""

    def __str__(self) -> str:  # KeyError would repr() the message; keep it readable
        return str(self.args[0]) if self.args else ""


class InvalidArgumentError(PQLoaderError, ValueError):
    """An argument out of its range (``batch_size=0``, ``rank >= world_size``, ...)."""


class DataError(PQLoaderError, ValueError):
    """Values that cannot become a batch, such as nulls in an integer column."""


class StateMismatchError(PQLoaderError, ValueError):
    """A saved loader state that belongs to another dataset or incompatible settings."""


class LoaderTimeoutError(PQLoaderError, TimeoutError):
    """No batch arrived within the loader's ``timeout`` seconds."""


class IncompleteEpochError(PQLoaderError, RuntimeError):
    """A pass that an error ended was asked for another batch: the rest of its epoch was not
    delivered (raised once, then the pass is over)."""


class RemoteIOError(PQLoaderError, OSError):
    """A remote request that failed for good: denied, or still failing after every retry."""


def check_positive(name: str, value: int, *, allow_zero: bool = False) -> int:
    """Return ``value`` if it is a positive int (or zero when allowed), else raise naming it."""
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        bound = ">= 0" if allow_zero else ">= 1"
        raise InvalidArgumentError(f"{name} must be an int {bound}, got {value!r}")
    return value


_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def user_stacklevel() -> int:
    """The ``stacklevel`` at which a warning raised by the caller of this function points at
    the first frame outside pqloader: the user's line, whichever of pqloader's entry points
    (``DataLoader``, ``ds.to_torch``) led there."""
    frame = sys._getframe(1)  # the caller, who warns: stacklevel 1
    level = 1
    while frame.f_back is not None and os.path.dirname(
            os.path.abspath(frame.f_code.co_filename)) == _PACKAGE:
        frame = frame.f_back
        level += 1
    return level


def bad_text(name: str, exc: UnicodeDecodeError) -> str:
    """The error for a string column ``name`` holding bytes that are not UTF-8."""
    return (f"column {name!r} holds text that is not UTF-8 ({exc.reason} at byte "
            f"{exc.start} of a value): the file is damaged (ParquetDataset(..., "
            "verify_checksums=True) finds damaged pages where the writer left checksums), or "
            "the column holds bytes written as strings; rewrite it as binary, or leave it out "
            "with columns=[...]")


_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISDIR, "a folder"))


def regular(path: str | os.PathLike[str], st: os.stat_result) -> None:
    """Refuse what is no regular file: reading a named pipe blocked the open forever (found
    by fuzzing), a device read without end."""
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "no regular file")
        raise CorruptFileError(f"{path}: {kind}, not a Parquet file; remove it, or pass a "
                               "glob or a list that leaves it out")


def unreadable(path: str | os.PathLike[str], exc: OSError) -> PQLoaderError | None:
    """``exc``, met opening or reading the local file or folder ``path``, worded when it is
    no fault of the bytes (told as a corrupt file, a permission error said to rewrite the
    file): permission denied, a broken symbolic link, a loop of links. None for any other."""
    if isinstance(exc, PermissionError):
        return PermissionDeniedError(
            f"{path}: permission denied; this process may not read it: give it read access "
            "(and its folders read and execute), or leave it out of the source")
    if exc.errno == errno.ELOOP:
        return CorruptFileError(f"{path}: a loop of symbolic links, not a file; remove the "
                                "link, or leave it out of the source")
    if isinstance(exc, FileNotFoundError) and os.path.islink(path):
        return DatasetNotFoundError(
            f"{path}: a symbolic link to {os.readlink(path)!r}, which does not "
            "exist; mend the link or remove it")
    if isinstance(exc, FileNotFoundError):  # listed, then gone
        return DatasetNotFoundError(
            f"{path}: the file went while the dataset was being opened ({exc}); a write may "
            "be replacing the dataset: open it again once it is done")
    return None
