"""What ``pqloader inspect`` reports: files, rows, row groups, bytes, codecs and the schema."""

from __future__ import annotations

import warnings
from typing import Any

import pyarrow.parquet as pq

import pqloader

from ._discover import SKIPPED_LOCAL, SKIPPED_REMOTE, read_footers
from ._signed import redact
from ._sizes import leaf_owners

_MAX_FILES_SHOWN = 20


def human_bytes(size: int) -> str:
    """``1288490189`` -> ``'1.2 GiB'``: binary units, one decimal."""
    if size < 1024:
        return f"{size} B"
    value, units = size / 1024, ["KiB", "MiB", "GiB", "TiB"]
    while value >= 1024 and len(units) > 1:
        value, units = value / 1024, units[1:]
    return f"{value:.1f} {units[0]}"


def _file_facts(path: str, md: pq.FileMetaData, columns: set[str] | None) -> dict[str, Any]:
    """Rows, row groups, bytes and codecs of one footer, counting only ``columns`` if given."""
    compressed = uncompressed = 0
    codecs: set[str] = set()
    owners = leaf_owners(md)  # "tokens.list.element" belongs to column "tokens"
    for i in range(md.num_row_groups):
        group = md.row_group(i)
        for j in range(group.num_columns):
            chunk = group.column(j)
            top = owners[j] if owners else chunk.path_in_schema.split(".", 1)[0]
            if columns is not None and top not in columns:
                continue
            compressed += chunk.total_compressed_size
            uncompressed += chunk.total_uncompressed_size
            codecs.add(chunk.compression)
    return {"path": path, "num_rows": md.num_rows, "num_row_groups": md.num_row_groups,
            "compressed_bytes": compressed, "uncompressed_bytes": uncompressed,
            "compression": sorted(codecs)}


def inspect_dataset(source: str, columns: list[str] | None = None,
                    skip_bad_files: bool = False) -> dict[str, Any]:
    """The facts ``pqloader inspect`` prints, as one JSON-serialisable dict; with
    ``skip_bad_files``, the files that cannot be read under ``"skipped"`` (each with why)."""
    with warnings.catch_warnings():  # the skipped files are listed, not warned of
        warnings.filterwarnings("ignore", message=".*on_bad_file='skip'")
        ds = pqloader.ParquetDataset(source, columns=columns,
                                     on_bad_file="skip" if skip_bad_files else "raise")
    wanted = None if columns is None else set(columns)
    skipped = {redact(p): why for p, why in ds.skipped_files.items()}
    footers = _footers(ds, skipped) if skip_bad_files else list(zip(ds.files, ds.metadata,
                                                                    strict=True))
    files = [_file_facts(redact(p), md, wanted)  # a signed URL's secrets are for reading
             for p, md in footers]
    codecs = sorted({c for f in files for c in f.pop("compression")})
    totals = {key: sum(f[key] for f in files) for key in
              ("num_rows", "num_row_groups", "compressed_bytes", "uncompressed_bytes")}
    return {"path": redact(str(source)), "num_files": len(files), **totals,
            "compression": codecs,
            "schema": [{"name": n, "type": str(t)} for n, t in ds.columns.items()],
            "files": files, **({"skipped": [{"path": p, "why": why} for p, why in
                                            skipped.items()]} if skip_bad_files else {})}


def _footers(ds: pqloader.ParquetDataset, skipped: dict[str, str]
             ) -> list[tuple[str, pq.FileMetaData]]:
    """Each file and its footer, less those whose footer cannot be read, added to
    ``skipped``: a dataset opened from its manifest reads footers now, and the first bad one
    stopped ``inspect --skip-bad-files`` (found by a CLI fuzzer). Read together first, then
    one at a time where that fails."""
    try:
        return list(zip(ds.files, ds.metadata, strict=True))
    except pqloader.PQLoaderError:
        pass
    d = ds._discovery  # (the footers of one file at a time)
    bad = SKIPPED_LOCAL if d.store is None else SKIPPED_REMOTE  # what on_bad_file skips: a
    kept = []  # read that failed after its retries is no bad file (found in review)
    for path, entry in zip(ds.files, d.files, strict=True):
        try:
            kept.append((path, read_footers([entry], d.store, d.cache)[0]))
        except bad as exc:
            skipped[redact(path)] = str(exc)
    return kept


def print_inspect(facts: dict[str, Any]) -> None:
    for label, value in [
        ("path", facts["path"]), ("files", f"{facts['num_files']:,}"),
        ("rows", f"{facts['num_rows']:,}"), ("row groups", f"{facts['num_row_groups']:,}"),
        ("compressed", human_bytes(facts["compressed_bytes"])),
        ("uncompressed", human_bytes(facts["uncompressed_bytes"])),
        ("compression", ", ".join(facts["compression"]) or "-"), ("schema", ""),
    ]:
        print(f"{label:<14}{value}".rstrip())
    for field in facts["schema"]:
        print(f"  {field['name']}: {field['type']}")
    shown = facts["files"][:_MAX_FILES_SHOWN]
    width = max([len("path"), *(len(f["path"]) for f in shown)])
    print(f"{'path':<{width}}  {'rows':>12}  {'row groups':>10}  {'compressed':>10}")
    for f in shown:
        print(f"{f['path']:<{width}}  {f['num_rows']:>12,}  {f['num_row_groups']:>10,}  "
              f"{human_bytes(f['compressed_bytes']):>10}")
    if len(facts["files"]) > len(shown):
        print(f"... {len(facts['files']) - len(shown):,} more")
    if skipped := facts.get("skipped"):
        print(f"skipped       {len(skipped):,} files that cannot be read:")
        for f in skipped:
            print(f"  {f['why']}")
