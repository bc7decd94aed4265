"""Dictionary-encoded strings, measured in a few row groups when a dataset opens: a footer counts
each distinct value once (``_sizes.py``), and shuffle windows are sized from these.

A leaf column is read, as dictionaries (never decoded: 4 distinct 1 KB values over 1M rows would
take 1 GB), in one small row group of the first file where it has values; that :class:`Sample`
stands for every file, scaled by the lengths of each chunk's min and max values. Where a chunk
or the sample has no min and max (``write_statistics=False``; values over 4 KB, which Arrow
leaves out of statistics; parquet-mr before 1.10), nothing scales it: a few such files are
measured themselves, and the others take the longest values measured (first file's 8-byte names
stood for 800-byte ones elsewhere: windows 40x their size).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ._schema import holds
from ._sizes import (
    Sample,
    arrow_of,
    chunk_reference,
    has_bytes,
    has_values,
    is_flat_bytes,
    largest_row_group,
    leaves_of,
    present,
    statistics,
)

_SAMPLE_BYTES = 8 << 20  # the most bytes of dictionary strings (uncompressed) read to measure
_SAMPLE_READS = 4  # the most row groups read to measure (one, unless some leaves are null)
_SAMPLE_LOOK = 64  # the most footers looked through for a leaf's values
_UNSCALED_READS = 8  # the most files measured for a leaf whose sample cannot be scaled to them
_TEXT = ("STRING", "NONE")  # a leaf's logical type: text, or bytes (not a decimal, JSON...)

Reads = list[tuple[int, int, dict[str, int]]]  # (file, row group, {leaf path: leaf column})
Measure = Callable[[int, int, dict[str, int]], dict[str, Sample]]  # one of those reads


def measure_files(footers: Sequence[pq.FileMetaData], columns: Collection[str] | None,
                  read: Measure) -> list[dict[str, Sample]]:
    """The samples that stand for each file's dictionary-encoded string leaves of ``columns``
    (all by default): :func:`sample_plan`'s, then :func:`unscaled_plan`'s where those cannot be
    scaled. ``read`` measures one read (:func:`measure`), ``{}`` when it fails (the footer's
    sizes then stand)."""
    by_file: dict[int, dict[str, Sample]] = defaultdict(dict)
    for f, rg, leaves in sample_plan(footers, columns):
        by_file[f] |= read(f, rg, leaves)
    measured: dict[str, Sample] = {}
    for f in sorted(by_file):
        measured |= {p: s for p, s in by_file[f].items() if p not in measured}
    unscaled = [_unscaled(md, measured) for md in footers]
    for f, rg, leaves in unscaled_plan(footers, columns, unscaled, by_file):
        by_file[f] |= read(f, rg, leaves)
    longest: dict[str, float] = {}
    for samples in by_file.values():
        for p, s in samples.items():
            longest[p] = max(longest.get(p, 0.0), s.value_bytes)
    out = []
    for f in range(len(footers)):
        own = by_file.get(f, {})
        out.append(measured if not own and not unscaled[f] else  # the common case: shared
                   {p: own[p] if p in own else replace(s, value_bytes=longest[p], reference=None)
                    if p in unscaled[f] else s for p, s in measured.items()})
    return out


def unscaled_plan(footers: Sequence[pq.FileMetaData], columns: Collection[str] | None,
                  unscaled: Sequence[Collection[str]], done: Collection[int]) -> Reads:
    """Reads that measure, for each leaf, up to ``_UNSCALED_READS`` of the files (spread over
    the dataset; not those ``done``) whose chunks its sample cannot be scaled to (``unscaled``:
    those leaves of each file, :func:`_unscaled`)."""
    chosen: dict[int, set[str]] = defaultdict(set)
    for path in sorted(set().union(*unscaled)):
        files = [f for f, paths in enumerate(unscaled) if path in paths and f not in done]
        if files:
            picks = np.linspace(0, len(files) - 1, _UNSCALED_READS).round().astype(int)
            for k in np.unique(picks).tolist():
                chosen[files[k]].add(path)
    plan: Reads = []
    for f in sorted(chosen):
        rg, leaves = dictionary_strings(footers[f], columns)
        if found := {p: i for p, i in leaves.items() if p in chosen[f]}:
            plan.append((f, rg, found))
    return plan


def _unscaled(md: pq.FileMetaData, measured: dict[str, Sample]) -> set[str]:
    """The leaves of ``measured`` whose sample cannot be scaled to ``md``'s dictionary-encoded
    chunk of them (its largest row group's, as :func:`_sizes.row_bytes` sizes) for lack of min
    and max values, there or in the sample. A walk through the row group's columns once (not
    once a leaf: 2,000 files of 30 string columns opened 60% slower, found in review)."""
    rg = largest_row_group(md) if measured else None
    if rg is None:
        return set()
    out = set()
    leaves = leaves_of(md)
    for i, path in enumerate(leaves.paths):  # (a chunk asked for where sampled only)
        sample = measured.get(path)
        if sample is None or not (chunk := rg.column(i)).has_dictionary_page:
            continue
        leaf_type = leaves.kinds[i]
        if sample.reference and (stats := statistics(chunk, leaf_type)) is not None \
                and stats.has_min_max:
            continue  # scaled by its min and max: the common case, first
        if has_values(chunk, leaf_type):
            out.add(path)
    return out


def dictionary_strings(md: pq.FileMetaData, columns: Collection[str] | None = None
                       ) -> tuple[int, dict[str, int]]:
    """The string and binary leaf columns of ``md``, top-level or in lists, structs and maps,
    that its largest row group stores with a dictionary: (that row group, {leaf path: leaf
    column}). Their footer sizes undercount them; :func:`measure` measures them. Only those of
    top-level ``columns`` (all by default) that Arrow reads as strings: a pandas categorical is
    read as a dictionary, as small as its footer says. At most ``_SAMPLE_BYTES`` of their
    top-level columns, uncompressed (what a read holds; a dictionary that fell back to plain
    pages is as large as its footer says, and never worth reading)."""
    rg = largest_row_group(md)
    arrow, owners = arrow_of(md)
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
                 if p not in done and has_values(md.row_group(rg).column(i),
                                                 md.schema.column(i).physical_type)}
        if found:
            plan.append((f, rg, found))
            done |= found.keys()
        waiting = (waiting | leaves.keys()) - done
        if (plan and not waiting) or len(plan) == _SAMPLE_READS:
            break
    return plan


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
        # as large strings (_views.unviewed)
        chunk = rg.column(leaf)
        leaf_type = handle.metadata.schema.column(leaf).physical_type
        out[path] = Sample(sum(map(_value_bytes, values)) / max(1, present(chunk, leaf_type)),
                           width, chunk_reference(chunk, leaf_type))
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
