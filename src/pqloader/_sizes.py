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
measures those (``_measure.py``), top-level or nested in lists, structs and maps: it reads one
small row group of each such leaf column, as dictionaries (never decoded: 4 distinct 1 KB values
over 1M rows would take 1 GB), into a :class:`Sample` each, which :func:`row_bytes` scales to
every other file by the lengths of its chunks' min and max values (a shard of long names and one
of short ones).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ._schema import holds

RowBytes = dict[str, float]  # top-level column -> decoded bytes per row


@dataclass(frozen=True)
class Sample:
    """A dictionary-encoded string or binary leaf column, measured in one row group."""

    value_bytes: float  # the mean length of its values (a null, an empty list's slot: 0)
    offset_bytes: int  # per value: 4, 8 for large_string and large_binary (and views)
    reference: float | None  # the mean length of its min and max value there (footer stats)


_WIDTH = {"BOOLEAN": 0.125, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8,
          "INT96": 8}  # INT96 timestamps decode to 8-byte ones
_SAMPLE_BYTES = 8 << 20  # the most bytes of dictionary strings (uncompressed) read to measure
_SAMPLE_READS = 4  # the most row groups read to measure (one, unless some leaves are null)
_SAMPLE_LOOK = 64  # the most footers looked through for a leaf's values
_TEXT = ("STRING", "NONE")  # a leaf's logical type: text, or bytes (not a decimal, JSON...)


def row_bytes(md: pq.FileMetaData, measured: dict[str, Sample] | None = None
              ) -> RowBytes | None:
    """Decoded bytes per row of each top-level column, from the file's largest row group
    (``None`` for a file without rows). ``measured``: dictionary-encoded string leaf columns by
    path (:func:`measure`), for this file's chunks of them that are dictionary-encoded too.
    """
    rg = _largest(md)
    if rg is None:
        return None
    owners = leaf_owners(md)
    out: RowBytes = {}
    for i in range(rg.num_columns):
        chunk = rg.column(i)
        leaf = md.schema.column(i)
        kind = chunk.physical_type
        if kind in _WIDTH:
            size = chunk.num_values * _WIDTH[kind]
        elif kind == "FIXED_LEN_BYTE_ARRAY":
            size = chunk.num_values * leaf.length
        else:  # BYTE_ARRAY: strings, binaries
            size = max(chunk.total_uncompressed_size, 4 * chunk.num_values)
            sample = measured.get(chunk.path_in_schema) if measured else None
            if sample is not None and chunk.has_dictionary_page and _has_values(chunk):
                size = max(size, _scaled(sample, chunk))
        size += 4 * rg.num_rows * leaf.max_repetition_level  # list offsets
        name = owners[i] if owners else chunk.path_in_schema.split(".", 1)[0]
        out[name] = out.get(name, 0.0) + size / rg.num_rows
    return out


def _scaled(sample: Sample, chunk: pq.ColumnChunkMetaData) -> float:
    """A dictionary-encoded chunk's decoded bytes, from a sample of its column elsewhere."""
    scale = 1.0
    reference = _reference(chunk)
    if reference is not None and sample.reference:
        scale = reference / sample.reference
    return float(chunk.num_values * (sample.offset_bytes + sample.value_bytes * scale))


def _reference(chunk: pq.ColumnChunkMetaData) -> float | None:
    """The mean length in bytes of a chunk's min and max value, where its statistics have them."""
    stats = chunk.statistics
    if stats is None or not stats.has_min_max:
        return None
    lengths = [len(v.encode() if isinstance(v, str) else v) for v in (stats.min, stats.max)]
    return sum(lengths) / 2


def dictionary_strings(md: pq.FileMetaData, columns: Collection[str] | None = None
                       ) -> tuple[int, dict[str, int]]:
    """The string and binary leaf columns of ``md``, top-level or in lists, structs and maps,
    that its largest row group stores with a dictionary: (that row group, {leaf path: leaf
    column}). Their footer sizes undercount them; :func:`measure` measures them. Only those of
    top-level ``columns`` (all by default) that Arrow reads as strings: a pandas categorical is
    read as a dictionary, as small as its footer says. At most ``_SAMPLE_BYTES`` of their
    top-level columns, uncompressed (what a read holds; a dictionary that fell back to plain
    pages is as large as its footer says, and never worth reading)."""
    rg = _largest(md)
    arrow = md.schema.to_arrow_schema()
    owners = leaf_owners(md, arrow)
    if rg is None or owners is None:
        return 0, {}
    wanted = {f.name for f in arrow if has_bytes(f.type) and not _has_dictionary(f.type)
              and (columns is None or f.name in columns)}
    paths = [rg.column(i).path_in_schema for i in range(rg.num_columns)]
    unique = {p for p, n in Counter(paths).items() if n == 1}  # not a top-level "a.b" beside a.b
    held = Counter[str]()
    for i, owner in enumerate(owners):
        held[owner] += rg.column(i).total_uncompressed_size
    leaves: dict[str, int] = {}
    taken: set[str] = set()
    total = 0
    for i, path in enumerate(paths):
        chunk = rg.column(i)
        if not (owners[i] in wanted and chunk.physical_type == "BYTE_ARRAY"
                and chunk.has_dictionary_page and path in unique
                and md.schema.column(i).logical_type.type in _TEXT):
            continue
        cost = 0 if owners[i] in taken else held[owners[i]]
        if total + cost <= _SAMPLE_BYTES:
            leaves[path] = i
            taken.add(owners[i])
            total += cost
    index = max(range(md.num_row_groups), key=lambda i: md.row_group(i).num_rows)
    return index, leaves


def sample_plan(footers: Sequence[pq.FileMetaData | None],
                columns: Collection[str] | None = None) -> list[tuple[int, int, dict[str, int]]]:
    """Where to measure the dictionary-encoded string leaves of ``columns`` that files of
    ``footers`` (in order; they stop at the first ``None``) hold: (file, row group, {leaf path:
    leaf column}) per read, each leaf in the first file where it has values. The first file's
    in the common case; a leaf null there (a column a pipeline filled only later) measured 0
    bytes a value, and every other file's 24x too small. At most ``_SAMPLE_READS`` reads, and
    ``_SAMPLE_LOOK`` files looked through for a leaf null in all the first ones."""
    plan: list[tuple[int, int, dict[str, int]]] = []
    done: set[str] = set()
    waiting: set[str] = set()  # seen, always null so far
    for f, md in enumerate(footers[:_SAMPLE_LOOK]):
        if md is None:
            break
        rg, leaves = dictionary_strings(md, columns)
        found = {p: i for p, i in leaves.items()
                 if p not in done and _has_values(md.row_group(rg).column(i))}
        if found:
            plan.append((f, rg, found))
            done |= found.keys()
        waiting = (waiting | leaves.keys()) - done
        if (plan and not waiting) or len(plan) == _SAMPLE_READS:
            break
    return plan


def _has_values(chunk: pq.ColumnChunkMetaData) -> bool:
    """Whether a column chunk holds a value that is not null (``True`` when unknown)."""
    stats = chunk.statistics
    if stats is None or not stats.has_null_count:
        return True
    return bool(stats.null_count < chunk.num_values)


def measure(handle: pq.ParquetFile, row_group: int, leaves: dict[str, int]
            ) -> dict[str, Sample]:
    """The leaf columns ``leaves`` names ({path: leaf column}, :func:`dictionary_strings`),
    measured in row group ``row_group`` of ``handle``, a file opened with those paths in
    ``read_dictionary``: each leaf is read alone and its values counted through the
    dictionary, never decoded."""
    rg = handle.metadata.row_group(row_group)
    out = {}
    for path, leaf in leaves.items():
        values = [_leaf(chunk) for chunk in
                  handle.read_row_group(row_group, columns=[path]).column(0).chunks]
        t = values[0].type.value_type if values and pa.types.is_dictionary(values[0].type) \
            else values[0].type if values else pa.string()
        width = 4 if pa.types.is_string(t) or pa.types.is_binary(t) else 8  # views are read
        # as large strings (_schema.unviewed)
        chunk = rg.column(leaf)
        out[path] = Sample(sum(map(_value_bytes, values)) / max(1, chunk.num_values), width,
                           _reference(chunk))
    return out


def _leaf(array: pa.Array) -> pa.Array:
    """The string or binary values of a column read for one leaf: through its lists (all their
    values: the array is fresh from a read, not a slice), structs and maps."""
    while not (pa.types.is_dictionary(array.type) or is_flat_bytes(array.type)):
        if pa.types.is_struct(array.type):
            array = array.field(0)
        elif array.type.num_fields == 1 and hasattr(array, "values"):  # lists, a map's entries
            array = array.values
        else:
            raise TypeError(f"{array.type} holds no string or binary leaf")
    return array


def _value_bytes(array: pa.Array) -> int:
    """The bytes of a string or binary array's values, counted through its dictionary."""
    if pa.types.is_dictionary(array.type):
        lengths = pc.take(pc.binary_length(array.dictionary), array.indices)
    else:
        lengths = pc.binary_length(array)
    return int(pc.sum(lengths).as_py() or 0)


def _has_dictionary(t: pa.DataType) -> bool:
    return holds(t, pa.types.is_dictionary)


def has_bytes(t: pa.DataType) -> bool:
    """A string or binary type, or one that holds some in its lists, structs or maps."""
    return holds(t, is_flat_bytes)


def is_flat_bytes(t: pa.DataType) -> bool:
    """A string or binary type, of any offset width: one Parquet BYTE_ARRAY leaf, no nesting."""
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t) or pa.types.is_string_view(t)
                or pa.types.is_binary_view(t))


def _largest(md: pq.FileMetaData) -> pq.RowGroupMetaData | None:
    """The row group with the most rows (``None`` if no row group has rows)."""
    if md.num_row_groups == 0:
        return None
    rg = max((md.row_group(i) for i in range(md.num_row_groups)), key=lambda g: g.num_rows)
    return rg if rg.num_rows > 0 else None


def leaf_owners(md: pq.FileMetaData, arrow: pa.Schema | None = None) -> list[str] | None:
    """The top-level column of each Parquet leaf column, in leaf order. From the Arrow schema
    (``arrow``: ``md``'s, if converted already), not the leaf's dotted path: a column named
    ``emb.vec`` is not a field of ``emb``. ``None`` when the two schemas' leaves do not line
    up."""
    owners: list[str] = []
    for field in arrow if arrow is not None else md.schema.to_arrow_schema():
        owners += [field.name] * leaf_count(field.type)
    return owners if len(owners) == md.num_columns else None


def leaf_count(t: pa.DataType) -> int:
    """Parquet leaf columns a column of Arrow type ``t`` is stored in."""
    if t.num_fields == 0 or pa.types.is_dictionary(t):
        return 1
    return sum(leaf_count(t.field(i).type) for i in range(t.num_fields))


def fragment_bytes(rows: int, per_row: RowBytes | None, columns: list[str],
                   encoded: int) -> int:
    """A row group's decoded size for ``columns`` (those the file has); ``encoded`` (the
    footer's ``total_byte_size``) where the per-row sizes are unknown."""
    if per_row is None:
        return encoded
    return int(rows * sum(per_row.get(c, 8.0) for c in columns))  # else: a partition column
