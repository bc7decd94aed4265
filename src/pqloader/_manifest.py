"""The dataset manifest: what opening a dataset needs, so that no footer has to be read.

:func:`pqloader.write_dataset` writes ``_pqloader_manifest.json`` beside its files (the leading
underscore keeps it out of the data, as Spark's ``_SUCCESS``): each file's relative name, size
and row groups (rows, bytes), its columns' decoded bytes per row (``_sizes``), and the Arrow
schema. Opening a folder whose data files match it
by name and size reads that one small file instead of every footer; a manifest that does not
match (a file added or rewritten) is ignored with a warning, and footers are read; a file it
lists that is missing is an error (rows would be missing).
"""

from __future__ import annotations

import base64
import json
import os
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ._errors import CorruptFileError
from ._int96 import file_schema
from ._samples import measure, measure_files
from ._sizes import RowBytes, Sample, has_bytes, row_bytes
from ._stamps import Stamp, stamp_of

NAME = "_pqloader_manifest.json"
TMP_PREFIX = f".{NAME}.tmp-"  # its temporary file, renamed into place
# Lies in a folder while write_dataset fills it (or swaps a new dataset in), and stays when it
# fails or is killed: opening the folder then refuses, rather than read a part of the rows.
INCOMPLETE = "_pqloader_incomplete"
FORMAT = "pqloader.manifest"
# 2 added each file's "row_bytes"; 3 measures dictionary-encoded strings in them (_measure.py);
# 4 measures those nested in lists, structs and maps too; 5 measures each where it has values (4
# measured a column null in the first file as empty everywhere); 6 measures files whose chunks
# lack min and max values themselves (5 sized them as the first file), and values per value not
# null (5 sized a column sparse where it was measured as sparse everywhere). An older manifest
# is still read, unless it has such columns, which it may have measured wrong (then the footers
# are).
VERSION = 6


@dataclass(frozen=True)
class ManifestFile:
    path: Any  # a Path, or a URL for a remote dataset
    size_bytes: int
    row_group_rows: tuple[int, ...]
    row_group_bytes: tuple[int, ...]
    row_bytes: RowBytes | None = None  # decoded bytes per row by column (None: version 1)
    stamp: Stamp | None = None  # a local file's inode and mtime as found when opened


@dataclass(frozen=True)
class Manifest:
    files: tuple[ManifestFile, ...]
    schema: pa.Schema


def write_manifest(root: Path, paths: list[str]) -> None:
    """Describe ``paths`` (all in ``root``) in ``root/_pqloader_manifest.json``, atomically."""
    if not paths:
        return
    footers = [pq.read_metadata(path) for path in paths]
    measured = _measured(paths, footers)
    files = []
    for path, md, samples in zip(paths, footers, measured, strict=True):
        groups = [md.row_group(i) for i in range(md.num_row_groups)]
        files.append({"name": os.path.relpath(path, root), "size": os.path.getsize(path),
                      "rows": [g.num_rows for g in groups],
                      "bytes": [g.total_byte_size for g in groups],
                      "row_bytes": row_bytes(md, samples)})
    schema = file_schema(footers[0])
    body = {"format": FORMAT, "version": VERSION, "files": files,
            "schema": base64.b64encode(schema.serialize().to_pybytes()).decode()}
    tmp = root / f"{TMP_PREFIX}{uuid.uuid4().hex}"
    try:
        tmp.write_text(json.dumps(body, separators=(",", ":")), encoding="utf-8")
        os.replace(tmp, root / NAME)
    except BaseException:  # a full disk: no half-written file left (a kill is the next
        tmp.unlink(missing_ok=True)  # write's to clean: _writing.remove_leftovers)
        raise


def _measured(paths: list[str], footers: list[pq.FileMetaData]) -> list[dict[str, Sample]]:
    """The dictionary-encoded strings, measured as ``_measure.py`` does when a dataset opens
    without a manifest."""
    def read(f: int, rg: int, leaves: dict[str, int]) -> dict[str, Sample]:
        try:
            handle = pq.ParquetFile(paths[f], metadata=footers[f], read_dictionary=list(leaves))
            return measure(handle, rg, leaves)
        except (pa.ArrowException, TypeError):  # left to the footers' sizes, as on open
            return {}

    return measure_files(footers, None, read)


def read_manifest(root: Path, paths: list[Path]) -> Manifest | None:
    """The manifest of ``root`` if it describes exactly ``paths`` as they are on disk now."""
    file = root / NAME
    if not file.is_file():
        return None
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        warnings.warn(f"{file}: unreadable manifest ({exc}); reading the footers instead",
                      stacklevel=3)
        return None
    # Names by slicing off the root (paths come from walking it): os.path.relpath and pathlib
    # cost ~25 us a file, a third of opening 2,000 files from their manifest.
    prefix = os.path.join(root, "")
    by_name: dict[str, Path] = {}
    for p in paths:
        s = os.fspath(p)
        by_name[s[len(prefix):] if s.startswith(prefix) else os.path.relpath(s, root)] = p
    try:
        stats = {name: os.stat(p) for name, p in by_name.items()}
    except OSError:  # gone, a broken link, unreadable: the manifest does not describe the
        return None  # files; their footers say what each is (or on_bad_file="skip" skips it)
    return match_manifest(text, str(file), {name: st.st_size for name, st in stats.items()},
                          by_name.__getitem__, {name: stamp_of(st) for name, st in stats.items()})


def match_manifest(text: str, where: str, found: dict[str, int], locate: Any,
                   stamps: dict[str, Stamp] | None = None) -> Manifest | None:
    """The manifest in ``text`` if it lists exactly ``found`` ({relative name: size}), in the
    order of ``found``; ``locate(name)`` makes each file's path, ``stamps`` (local files)
    each one's stamp. Else ``None``, with a warning that names ``where``."""
    try:
        body = json.loads(text)
        if not isinstance(body, dict):
            raise ValueError(f"a JSON {type(body).__name__}, not an object")
        if body.get("format") != FORMAT or body.get("version") not in (1, 2, 3, 4, 5, VERSION):
            raise ValueError(f"format {body.get('format')!r} version {body.get('version')!r}")
        listed = {f["name"]: _checked(f) for f in body["files"]}
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(body["schema"])))
    except (ValueError, KeyError, TypeError, pa.ArrowException) as exc:
        warnings.warn(f"{where}: unreadable manifest ({exc}); reading the footers instead",
                      stacklevel=4)
        return None
    if body["version"] < VERSION and any(has_bytes(f.type) for f in schema):
        return None  # its string sizes may be the footers' (7-24x too small): read the footers
    missing = sorted(set(listed) - set(found))
    if missing:  # read from the footers, the epoch was short of its rows: warned of only
        rows = sum(sum(listed[name]["rows"]) for name in missing)  # (found by fuzzing)
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise CorruptFileError(
            f"{where} lists {missing[0]}{more}, missing ({rows:,} rows): the dataset would be "
            "read short of them. Restore the files, or delete the manifest to read the files "
            "that are there")
    stale = [
        f"{name} is not listed" for name in sorted(set(found) - set(listed))] + [
        f"{name} changed size" for name in sorted(set(found) & set(listed))
        if found[name] != listed[name]["size"]]
    if stale:
        more = f", and {len(stale) - 1} more" if len(stale) > 1 else ""
        warnings.warn(f"{where} does not match the files ({stale[0]}{more}); reading the "
                      "footers instead. Rewrite the dataset, or delete the manifest",
                      stacklevel=4)
        return None
    return Manifest(
        files=tuple(ManifestFile(locate(name), int(listed[name]["size"]),
                                 tuple(listed[name]["rows"]), tuple(listed[name]["bytes"]),
                                 listed[name].get("row_bytes"),
                                 None if stamps is None else stamps[name])
                    for name in found),
        schema=schema,
    )


def _checked(entry: Any) -> dict[str, Any]:
    """A manifest's file entry, its fields of the types opening relies on (else ValueError)."""
    if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
            and type(entry.get("size")) is int and _counts(entry.get("rows"))
            and _counts(entry.get("bytes")) and len(entry["rows"]) == len(entry["bytes"])
            and isinstance(entry.get("row_bytes"), (dict, type(None)))):
        raise ValueError(f"a damaged file entry: {str(entry)[:120]}")
    return entry


def _counts(value: Any) -> bool:
    return isinstance(value, list) and all(type(x) is int and x >= 0 for x in value)


def incomplete_error(folder: str) -> CorruptFileError:
    """The error of opening a folder that a write_dataset did not finish."""
    return CorruptFileError(
        f"{folder}: write_dataset did not finish writing this folder (it failed or was "
        f"stopped; {INCOMPLETE} is there): rows are missing. Write it again (overwrite=True), "
        f"or delete {INCOMPLETE} to read the files it finished")
