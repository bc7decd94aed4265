"""A cache folder's entry files (``v2/ab/<sha256>.pqc``): found while folders come and go
(a cache deleted by hand under running jobs failed their reads, named as their data's fault:
found in review), and surveyed for ``pqloader cache ls|du``."""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ._entry import read_header


@dataclass(frozen=True)
class CacheEntry:
    """One cached range, as ``pqloader cache ls`` shows it."""

    url: str
    version: str | None
    offset: int
    length: int
    size_bytes: int  # on disk
    last_used: float  # seconds since the epoch
    path: Path


@dataclass(frozen=True)
class Survey:
    """What one scan of a cache found (``pqloader cache du``)."""

    entries: list[CacheEntry]  # least recently used first
    bytes: int  # of every entry file
    damaged_bytes: int  # of those whose header does not read: loaders delete them
    unreadable_bytes: int  # of those this user cannot open


def scan(folder: str | os.PathLike[str]) -> list[os.DirEntry[str]]:
    """A folder's entries; none if it is gone (one that cannot be read is an error: a cache
    counted short of it was evicted short of it, found in review)."""
    try:
        with os.scandir(folder) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


_HEX = frozenset("0123456789abcdef")


def is_entry_folder(sub: os.DirEntry[str]) -> bool:
    """``sub`` is a folder of entries (``ab/``: two hex digits)."""
    return len(sub.name) == 2 and set(sub.name) <= _HEX and sub.is_dir(follow_symlinks=False)


def entry_folders(root: Path) -> Iterator[os.DirEntry[str]]:
    """The folders of entries under a layout's folder ``root``."""
    return (sub for sub in scan(root) if is_entry_folder(sub))


TEMPORARY = re.compile(r"\.tmp-[0-9]+-[0-9a-f]{32}")  # what a put writes first


def is_entry_name(folder: str, name: str) -> bool:
    """``name`` in entry folder ``folder`` is an entry's: ``<sha256 hex>.pqc`` under its first
    two digits (every layout so far names them so)."""
    return len(name) == 68 and name.endswith(".pqc") and name.startswith(folder) and \
        set(name[:64]) <= _HEX


def entry_files(root: Path) -> Iterator[os.DirEntry[str]]:
    """The entry files under a layout's folder ``root``: ``ab/<sha256 hex>.pqc`` alone, never
    a file of the user's that ends in .pqc (``clear`` of a folder that was no cache deleted
    ``v2/photos/holiday.pqc``: found in review)."""
    for sub in entry_folders(root):
        for entry in scan(sub.path):
            if is_entry_name(sub.name, entry.name) and entry.is_file(follow_symlinks=False):
                yield entry


def survey(root: Path) -> Survey:
    """One scan of the entry files: the entries, and the bytes of all, of those whose header
    is damaged and of those this user cannot read (two scans told a file written between them
    as damaged: found in review)."""
    out = []
    total = damaged = unreadable = 0
    for entry in entry_files(root):
        try:
            st = entry.stat()
        except FileNotFoundError:
            continue
        total += st.st_size
        try:
            with open(entry.path, "rb") as f:
                header = read_header(f)
        except FileNotFoundError:
            total -= st.st_size
            continue
        except OSError:
            unreadable += st.st_size
            continue
        except (ValueError, struct.error):
            damaged += st.st_size
            continue
        out.append(CacheEntry(header["url"], header["version"], header["offset"],
                              header["length"], st.st_size, st.st_mtime, Path(entry.path)))
    return Survey(sorted(out, key=lambda e: e.last_used), total, damaged, unreadable)
