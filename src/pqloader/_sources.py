"""Sources to files: a folder, a glob, a file, a URL or a list of them, expanded into the data
files they name (hidden names skipped, each file once, in a stable order)."""

from __future__ import annotations

import glob
import os
import posixpath
import re
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from ._errors import (
    CorruptFileError,
    DatasetNotFoundError,
    EmptyDatasetError,
    InvalidArgumentError,
    unreadable,
)
from ._fs import ObjectInfo, Store
from ._manifest import INCOMPLETE, incomplete_error
from ._manifest import NAME as MANIFEST_NAME
from ._signed import redact, unsigned
from ._threads import executor

_GLOB_CHARS = set("*?[")
T = TypeVar("T")


def is_hidden(name: str) -> bool:
    """Not data: ``_SUCCESS``, ``_metadata``, ``.crc`` files, ``_temporary/`` folders, and a
    volume's ``lost+found`` (owned by root: refused as a folder that cannot be listed)."""
    # The convention of Spark, Hive and pyarrow.dataset: _SUCCESS, _metadata, .crc are not data.
    return name.startswith(("_", ".")) or name.endswith(".crc") or name == "lost+found"


def _walk(root: Path) -> list[Path]:
    """Data files below ``root``, folders that are symbolic links included (a dataset
    assembled from links to runs' outputs); a link back up the tree is followed once."""
    return _each_once(_walked(root))


def _walked(root: Path) -> list[str]:
    """:func:`_walk`'s files, before those that are another's link are left out."""
    found: list[str] = []
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root, onerror=_unlisted, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:  # a loop of links, or two links to one folder: read it once
            dirnames[:] = []
            continue
        seen.add(real)
        if INCOMPLETE in filenames:  # a partition folder a write_dataset did not finish
            raise incomplete_error(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not is_hidden(d))
        found.extend(os.path.join(dirpath, f) for f in sorted(filenames) if not is_hidden(f))
    return found


def _unlisted(exc: OSError) -> None:
    """A folder of the dataset that cannot be listed: its files would be left out silently
    (``os.walk`` skips it; found by fuzzing: half a dataset's rows read, no word)."""
    told = unreadable(exc.filename, exc)
    raise told or CorruptFileError(
        f"{exc.filename}: the folder cannot be listed ({exc}); its files would be left out of "
        "the dataset: mend it, or pass a glob or a list that leaves it out") from exc


def _listed(pattern: str, fixed: int) -> None:
    """Refuse a folder ``pattern``'s wildcards had to list and could not: ``glob`` skips it,
    and the files in it matched nothing, silently. A folder is listed where the pattern's
    next part is a wildcard (or below a ``**``); one the pattern only passes through by a
    fixed name need not be listable (a home folder of mode 711 under ``/home/*/data``)."""
    parts = pattern.split(os.sep)
    seen: set[str] = set()
    for k in range(len(parts) - 1):
        if not _GLOB_CHARS & set(parts[k + 1]):
            continue
        # Matched as folders alone (a trailing separator): a prefix holding "**" gave every
        # file below too, each then stat'ed (0.73 s of a glob of 20,000 files)
        prefix = parts[:k + 2] if parts[k + 1] == "**" else parts[:k + 1]
        for found in glob.glob(os.sep.join([*prefix, ""]), recursive=True):
            folder = found.rstrip(os.sep) or found
            if folder in seen or not os.path.isdir(folder) or any(
                    is_hidden(p) for p in folder[fixed:].split(os.sep) if p):
                continue
            seen.add(folder)
            try:
                with os.scandir(folder):
                    pass
            except OSError as exc:
                _unlisted(exc)


def _each_once(files: list[str]) -> list[Path]:
    """``files`` less those that are another's link (or the same file by another path): its
    rows came twice an epoch, as a folder's two links to one folder do not (found in
    review). Read once, as that folder is; a list naming a file twice is refused."""
    seen: set[str] = set()
    folders: dict[str, str] = {}
    out = []
    for path in files:
        real = _real(path, folders)
        if real not in seen:
            seen.add(real)
            out.append(Path(path))
    return out


def _real(path: str, folders: dict[str, str]) -> str:
    """``os.path.realpath(path)``, its folder's resolved once (``folders``): a file that is no
    link is its real folder's entry. One ``lstat`` a file, where ``realpath`` took one a part
    of its path and ~50 us of Python (1.8 of 3.2 s globbing 20,000 files, profiled)."""
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return os.path.realpath(path)
    except OSError:  # gone, or its folder may not be entered: as realpath does then
        return os.path.realpath(path)
    folder, name = os.path.split(path)
    if name in ("", ".", ".."):
        return os.path.realpath(path)
    if folder not in folders:
        folders[folder] = os.path.realpath(folder or os.curdir)
    return os.path.join(folders[folder], name)


def _once(items: list[T], key: Callable[[T], str]) -> list[T]:
    """A list source's files, each once, in the list's order: a file named twice (or a folder
    and a file in it) would deliver its rows twice an epoch, so that is an error."""
    seen: set[str] = set()
    for item in items:
        if key(item) in seen:
            name = redact(str(getattr(item, "path", item)))  # a remote object: its URL
            raise InvalidArgumentError(
                f"{name} is in the list of sources twice (or inside a folder also listed); "
                "its rows would come twice an epoch: list each file once")
        seen.add(key(item))
    return items


def _glob(pattern: str) -> list[Path]:
    """Files matching ``pattern``, skipping hidden names in the folders it matched as well
    (Spark's ``_temporary/``), as opening the folder does."""
    fixed = len(os.path.dirname(pattern[:min(pattern.find(c) for c in _GLOB_CHARS
                                               if c in pattern)]))
    out: list[str] = []
    for match in sorted(glob.glob(pattern, recursive=True)):
        below = match[fixed:].split(os.sep)
        if any(is_hidden(part) for part in below if part):
            continue
        if os.path.isdir(match):  # Spark's "out/b.parquet/" is a folder of files (its rows
            out.extend(_walked(Path(match)))  # were left out: found in review)
        else:  # a file; a broken link, a pipe...: refused as they are in a folder, not dropped
            out.append(match)
    _listed(pattern, fixed)
    for folder in sorted({os.path.dirname(p) for p in out}):  # a write_dataset not finished
        if os.path.exists(os.path.join(folder, INCOMPLETE)):
            raise incomplete_error(folder)
    return _each_once(out)  # also: "**" matches a folder and the files in it


def expand_source(source: object) -> tuple[list[Path], Path | None]:
    """Turn a directory, a glob, a file or a list of those into sorted files.

    Returns the files and the root directory below which hive ``key=value`` folders are parsed
    (``None`` when the source is not a single directory).
    """
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        text = text.removeprefix("file://")
        if not text.strip():  # Path("") is the working directory: never what was meant
            raise InvalidArgumentError(f"the path is empty ({os.fspath(source)!r}); pass a "
                                       "folder, a glob or a file")
        if _GLOB_CHARS & set(text) and not os.path.exists(text):  # "exp[1]/" is a folder
            files = _glob(text)
            if not files:
                raise EmptyDatasetError(f"{text}: the glob matches no file")
            return files, None
        path = Path(text)
        try:
            is_dir = path.is_dir()  # a folder above it that may not be entered: EACCES
        except OSError as exc:
            raise unreadable(path, exc) or DatasetNotFoundError(f"{path}: {exc}") from exc
        if is_dir:
            files = _walk(path)  # refuses a folder (or one below) write_dataset did not finish
            if not files:
                raise EmptyDatasetError(
                    f"{path}: the directory holds no data file (names starting with '_' or '.' "
                    "and '.crc' files are skipped)"
                )
            return files, path
        if path.is_file() or os.path.lexists(path):  # a pipe, a broken link: refused when
            return [path], None  # read, saying what it is
        raise DatasetNotFoundError(f"{path}: no such file or directory")
    if isinstance(source, Sequence) and not isinstance(source, (bytes, bytearray)):
        if not source:
            raise EmptyDatasetError("the list of files is empty; pass at least one path")
        files = [f for item in source for f in expand_source(item)[0]]
        return _once(files, os.path.realpath), None
    raise TypeError(
        f"source must be a path, a glob or a list of paths, got {type(source).__name__}"
    )


def list_remote(source: object, store: Store) -> tuple[list[ObjectInfo], str | None,
                                                        ObjectInfo | None]:
    """The data objects of a remote source, its root folder (for hive partitions and the
    manifest; ``None`` unless the source is one folder) and its manifest object, if any."""
    if isinstance(source, (list, tuple)):
        if not source:
            raise EmptyDatasetError("the list of files is empty; pass at least one URL")
        found = [o for item in source for o in list_remote(item, store)[0]]
        # one object under two URLs: two signatures of it, or "/./" in one
        return _once(found, lambda o: _object_key(o.path)), None, None
    if not isinstance(source, str):
        raise TypeError(f"source must be a URL or a list of URLs, got {type(source).__name__}")
    native = store.native(source)
    globbing = set("*[") if native.startswith(("http://", "https://")) else _GLOB_CHARS
    # "exp[1]/" is a folder, "exp[1]/a.parquet" a file: read as named where they exist, as
    # local paths are (asked only without a "*": that one is a glob, and the ask costs 2 requests)
    if globbing & set(native) and ("*" in native or not store.exists(native.rstrip("/"))):
        fixed = native[:min(native.find(c) for c in globbing if c in native)].rpartition("/")[0]
        found = [o for o in store.glob(native) if not any(  # hidden below what it names:
            is_hidden(part) for part in _below(o.path, fixed).split("/") if part)]  # _temporary/
        if not found:
            raise EmptyDatasetError(f"{source}: the glob matches no file")
        folders = sorted({o.path.rpartition("/")[0] for o in found})  # as _glob does
        with executor(min(16, len(folders)), "pqloader-list") as pool:  # a round trip each (HTTP)
            marked = list(pool.map(lambda f: store.exists(f"{f}/{INCOMPLETE}"), folders))
        if True in marked:
            raise incomplete_error(store.url(folders[marked.index(True)]))
        return found, None, None
    # A URL ending in "/" names a folder: listed at once, without a request to ask whether
    # it is one (a round trip per open: 70 ms through bench_remote's proxy).
    http = store.protocol in ("http", "https")
    if not source.endswith("/"):
        if http:
            # fsspec's isdir GETs the URL to look for links in it: a file's first megabytes
            # were sent for nothing (4 of a 16 MB file's, on loopback), before a HEAD for its
            # size. One HEAD tells both: an index page (text/html) is a folder.
            info, mimetype = store.info_and_type(native)
            if mimetype != "text/html" and (mimetype is not None or not store.isdir(native)):
                return [info], None, None
        elif not store.isdir(native):
            return [store.info(native)], None, None
    root = native.rstrip("/")
    data, manifest = [], None
    # an HTTP folder without its "/" is redirected to it: a round trip more (found in review)
    for obj in store.find(root + "/" if http else root):
        rel = obj.path[len(root) + 1:] if obj.path.startswith(root + "/") else obj.path
        if rel == MANIFEST_NAME:
            manifest = obj
        elif rel.rsplit("/", 1)[-1] == INCOMPLETE:  # in the folder or a partition below
            raise incomplete_error(f"{root}/{rel.rpartition('/')[0]}".rstrip("/"))
        elif not any(is_hidden(part) for part in rel.split("/")):
            data.append(obj)
    if not data and http:  # fsspec lists an unreachable host as empty: asked, it says so
        store.info_and_type(root + "/")  # (the folder, or the error of its request)
    if not data:
        raise EmptyDatasetError(
            f"{source}: the folder is missing or holds no data file (names starting with '_' "
            "or '.' and '.crc' files are skipped)")
    return data, root, manifest


def _below(path: str, fixed: str) -> str:
    """``path`` past the folder ``fixed`` a glob's pattern names before its first wildcard (its
    last name alone if the listing spells the folder otherwise)."""
    if fixed and path.startswith(fixed + "/"):
        return path[len(fixed) + 1:]
    return path.rsplit("/", 1)[-1]


def _object_key(url: str) -> str:
    """What tells one remote object from another: its URL without a signature; over HTTP, with
    ``.``, ``..`` and repeated slashes resolved, as servers do (an object store's keys are
    names: ``a//b`` and ``a/./b`` are other objects there)."""
    url = unsigned(url)
    scheme, _, rest = url.partition("://")
    if scheme not in ("http", "https"):
        return url
    path, query_sep, query = rest.partition("?")
    host, _, key = path.partition("/")
    key = posixpath.normpath("/" + re.sub("/+", "/", key)).lstrip("/")
    return f"{scheme}://{host}/{key}{query_sep}{query}"
