"""Decoded sizes from footers: the Arrow memory a row of each column takes, without reading it.

Shuffle windows are sized in decoded bytes. A footer's ``total_byte_size`` counts the encoded
pages: a dictionary-encoded column's dictionary plus its packed indices, which is 0.73x the
decoded size of W1's float32 columns and 0.5x that of W2's token lists (measured). For values of
a fixed width, the decoded size is exact from the value count: ``num_values`` (nulls included,
as Arrow keeps their slots) times the width, plus a 4-byte offset per row for each list level.
Strings and binaries keep their encoded size (at least a 4-byte offset per value): their
lengths are not in the footer. A dictionary-encoded one's encoded size counts each distinct value
once, so a column of a few category names measured 12 bytes a row against 85 decoded (windows
7x the size asked for), and a ``list<string>`` of tags 26 against 235. Opening a dataset
measures those (``_samples.py``) into a :class:`Sample` each, which :func:`row_bytes` scales to
every other file by the lengths of its chunks' min and max values (a shard of long names and one
of short ones).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ._schema import holds

RowBytes = dict[str, float]  # top-level column -> decoded bytes per row


@dataclass(frozen=True)
class Sample:
    """A dictionary-encoded string or binary leaf column, measured in one row group."""

    value_bytes: float  # the mean length of its values that are not null
    offset_bytes: int  # per value: 4, 8 for large_string and large_binary (and views)
    reference: float | None  # the mean length of its min and max value there (footer stats)


_WIDTH = {"BOOLEAN": 0.125, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8,
          "INT96": 8}  # INT96 timestamps decode to 8-byte ones


def row_bytes(md: pq.FileMetaData, measured: dict[str, Sample] | None = None
              ) -> RowBytes | None:
    """Decoded bytes per row of each top-level column, from the file's largest row group
    (``None`` for a file without rows). ``measured``: dictionary-encoded string leaf columns by
    path (``_samples.measure``), for this file's chunks of them that are dictionary-encoded too.
    """
    rg = largest_row_group(md)
    if rg is None:
        return None
    leaves = leaves_of(md)  # (a leaf's facts from it: 1.3 against 0.5 ms a file of 1,000)
    owners = leaves.owners or tuple(p.split(".", 1)[0] for p in leaves.paths)
    out: RowBytes = {}
    for i in range(rg.num_columns):
        chunk = rg.column(i)
        kind = chunk.physical_type
        if kind in _WIDTH:
            size = chunk.num_values * _WIDTH[kind]
        elif kind == "FIXED_LEN_BYTE_ARRAY":
            size = chunk.num_values * md.schema.column(i).length
        else:  # BYTE_ARRAY: strings, binaries
            size = max(chunk.total_uncompressed_size, 4 * chunk.num_values)
            sample = measured.get(leaves.paths[i]) if measured else None
            if sample is not None and chunk.has_dictionary_page and \
                    has_values(chunk, leaves.kinds[i]):
                size = max(size, _scaled(sample, chunk, leaves.kinds[i]))
        size += 4 * rg.num_rows * leaves.repeated[i]  # list offsets
        out[owners[i]] = out.get(owners[i], 0.0) + size / rg.num_rows
    return out


def _scaled(sample: Sample, chunk: pq.ColumnChunkMetaData, leaf_type: str) -> float:
    """A dictionary-encoded chunk's decoded bytes, from a sample of its column elsewhere."""
    scale = 1.0
    reference = chunk_reference(chunk, leaf_type)
    if reference is not None and sample.reference:
        scale = reference / sample.reference
    # an offset for every slot, values for those not null: a column a pipeline filled
    # later, sparse where it was sampled, sized every full file 20x too small
    return float(chunk.num_values * sample.offset_bytes
                 + present(chunk, leaf_type) * sample.value_bytes * scale)


def statistics(chunk: pq.ColumnChunkMetaData, leaf_type: str) -> pq.Statistics | None:
    """A column chunk's statistics; None where the chunk's physical type is not its column's
    (``leaf_type``): a damaged footer, whose statistics pyarrow aborted the process decoding
    (a C++ exception nothing catches, found by fuzzing). A read of the chunk names the damage."""
    return chunk.statistics if chunk.physical_type == leaf_type else None


def chunk_reference(chunk: pq.ColumnChunkMetaData, leaf_type: str) -> float | None:
    """The mean length in bytes of a chunk's min and max value, where its statistics have them."""
    stats = statistics(chunk, leaf_type)
    if stats is None or not stats.has_min_max:
        return None
    # raw: the bytes as stored (decoded, text that is not UTF-8 raised at the open)
    lengths = [len(v.encode() if isinstance(v, str) else v) for v in (stats.min_raw,
                                                                       stats.max_raw)]
    return sum(lengths) / 2


def present(chunk: pq.ColumnChunkMetaData, leaf_type: str) -> int:
    """A column chunk's values that are not null (all of them when its statistics do not
    say; a null or empty list's slot counts as a null)."""
    stats = statistics(chunk, leaf_type)
    nulls = stats.null_count if stats is not None and stats.has_null_count else 0
    return max(0, int(chunk.num_values) - int(nulls))


def has_values(chunk: pq.ColumnChunkMetaData, leaf_type: str) -> bool:
    """Whether a column chunk holds a value that is not null (``True`` when unknown)."""
    stats = statistics(chunk, leaf_type)
    if stats is None or not stats.has_null_count:
        return True
    return bool(stats.null_count < chunk.num_values)


def has_bytes(t: pa.DataType) -> bool:
    """A string or binary type, or one that holds some in its lists, structs or maps."""
    return holds(t, is_flat_bytes)


def is_flat_bytes(t: pa.DataType) -> bool:
    """A string or binary type, of any offset width: one Parquet BYTE_ARRAY leaf, no nesting."""
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t) or pa.types.is_string_view(t)
                or pa.types.is_binary_view(t))


def largest_row_group(md: pq.FileMetaData) -> pq.RowGroupMetaData | None:
    """The row group with the most rows (``None`` if no row group has rows)."""
    if md.num_row_groups == 0:
        return None
    rg = max((md.row_group(i) for i in range(md.num_row_groups)), key=lambda g: g.num_rows)
    return rg if rg.num_rows > 0 else None


def leaf_owners(md: pq.FileMetaData, arrow: pa.Schema | None = None
                ) -> tuple[str, ...] | None:
    """The top-level column of each Parquet leaf column, in leaf order. From the Arrow schema
    (``arrow``: ``md``'s, if converted already), not the leaf's dotted path: a column named
    ``emb.vec`` is not a field of ``emb``. ``None`` when the two schemas' leaves do not line
    up."""
    if arrow is None:
        return arrow_of(md)[1]
    owners: list[str] = []
    for field in arrow:
        owners += [field.name] * leaf_count(field.type)
    return tuple(owners) if len(owners) == md.num_columns else None


@dataclass(frozen=True)
class Leaves:
    """What a footer's schema says of its columns, the same for every file that has that
    schema: its Arrow schema (``md.schema.to_arrow_schema()``), :func:`leaf_owners`, and each
    Parquet leaf's dotted path, physical type and maximum repetition level."""

    arrow: pa.Schema
    owners: tuple[str, ...] | None
    paths: tuple[str, ...]
    kinds: tuple[str, ...]
    repeated: tuple[int, ...]


# The last footer's Leaves: a dataset's files mostly share one schema, and working it out took
# most of the open of a wide table (200 files of 1,000 columns: 2.4 s, now 1.0). One entry,
# replaced whole (footers are read in threads): (the schema as text, key-value metadata, the
# schema, Leaves). The text prints every node: ParquetSchema.equals compares the leaves alone,
# and a struct or list column renamed in a file written without the Arrow schema took the
# other file's names (its values read as nulls, silently; found in review).
_LAST: tuple[str, Any, pq.ParquetSchema, Leaves] | None = None


def leaves_of(md: pq.FileMetaData) -> Leaves:
    """``md``'s :class:`Leaves`, those of the last footer asked about where its schema (every
    node, with its annotations) and metadata (which holds the Arrow schema pyarrow wrote) are
    the same."""
    global _LAST
    # (0.1 ms for 1,000 columns; its first line names the object's address)
    last, text, metadata = _LAST, str(md.schema).partition("\n")[2], md.metadata
    if last is not None and last[0] == text and last[1] == metadata and \
            last[2].equals(md.schema):  # (leaves too: a name holding a newline prints nodes)
        return last[3]
    arrow = md.schema.to_arrow_schema()
    columns = [md.schema.column(i) for i in range(md.num_columns)]
    out = Leaves(arrow, leaf_owners(md, arrow), tuple(c.path for c in columns),
                 tuple(c.physical_type for c in columns),
                 tuple(c.max_repetition_level for c in columns))
    _LAST = (text, metadata, md.schema, out)
    return out


def arrow_of(md: pq.FileMetaData) -> tuple[pa.Schema, tuple[str, ...] | None]:
    """``md``'s Arrow schema and :func:`leaf_owners` (:func:`leaves_of`)."""
    leaves = leaves_of(md)
    return leaves.arrow, leaves.owners


def leaf_count(t: pa.DataType) -> int:
    """Parquet leaf columns a column of Arrow type ``t`` is stored in (an extension type's
    storage's: ``pa.opaque`` over a struct is stored in its fields, and counted as one, it
    shifted every later column's leaves; found in review)."""
    if isinstance(t, pa.BaseExtensionType):
        return leaf_count(t.storage_type)
    if t.num_fields == 0 or pa.types.is_dictionary(t):
        return 1
    return sum(leaf_count(t.field(i).type) for i in range(t.num_fields))


@dataclass(frozen=True)
class FileRows:
    """A file's decoded bytes a row: of the columns read (``wanted``), of all its columns
    (``total``), and whether those are all read (``every``). Worked out once a file, not
    once a row group: a row group's check of every column against the list of those read
    made opening 5,001 columns in 128 row groups take 11.6 s, not 0.13."""

    wanted: float
    total: float
    every: bool


def file_rows(per_row: RowBytes | None, columns: list[str]) -> FileRows | None:
    """``per_row`` for ``columns`` (those the file has; a partition column counts 8 bytes)."""
    if per_row is None:
        return None
    return FileRows(sum(per_row.get(c, 8.0) for c in columns), sum(per_row.values()),
                    per_row.keys() <= set(columns))


def fragments_bytes(rows: np.ndarray, sizes: FileRows | None, encoded: np.ndarray
                    ) -> np.ndarray:
    """The decoded sizes (int64) of a file's row groups of ``rows`` rows for the columns of
    ``sizes`` (:func:`file_rows`); ``encoded`` (the footers' ``total_byte_size``) where the
    per-row sizes are unknown. A file at once: a call a row group took ~1 s to open 200,000.

    The per-row sizes are the file's, from its largest row group: a file whose row groups
    hold rows of very different sizes (sorted by length, say) had its heavy row groups sized
    like its light ones, 0.0 against 15.8 MiB (found in review). So a row group read whole
    whose own uncompressed pages hold more than ``_HEAVIER`` times the file's row size
    counts at least those pages: decoding seldom shrinks values far below their pages.
    (Not every row group: dictionary pages of random floats hold 1.4x their decoded size,
    and windows were cut to match. Not a projection: ``encoded`` counts every column, and
    a share of it by the file's row sizes was 4,000x off, and differed between a manifest
    and the footers, which measure other columns; a projection needs each row group's own
    column sizes in the index.)"""
    rows, encoded = np.asarray(rows, np.int64), np.asarray(encoded, np.int64)
    if sizes is None:
        return encoded.copy()
    out = (rows * sizes.wanted).astype(np.int64)  # truncated, as int() does
    if sizes.every and sizes.total > 0:
        heavy = (rows > 0) & (encoded / np.maximum(rows, 1) > _HEAVIER * sizes.total)
        out[heavy] = np.maximum(rows[heavy] * sizes.wanted, encoded[heavy]).astype(np.int64)
    return out


_HEAVIER = 2.0  # a row group's pages per row past this many times the file's row size
