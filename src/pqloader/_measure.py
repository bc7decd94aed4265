"""Dictionary-encoded strings, measured when a dataset opens: their footer sizes count each
distinct value once (``_sizes.py``), and shuffle windows are sized from them. Top-level ones, and
those in lists, structs and maps (a ``list<string>`` of tags: 9x undercounted)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pyarrow as pa

from ._discover import Discovery, read_columns, widen_row_bytes
from ._errors import PQLoaderError
from ._read import FragmentReader
from ._samples import measure, measure_files
from ._sizes import Sample, file_rows, fragments_bytes, has_bytes, leaf_owners, row_bytes


def measure_strings(d: Discovery) -> Discovery:
    """``d`` with its row groups' decoded sizes re-estimated from reads: the dictionary-encoded
    string leaf columns of the projection, read as dictionaries in a few row groups
    (``_samples.measure_files``), stand for every file's dictionary-encoded chunks of them.

    Opened from a manifest (no footer in hand), ``d`` is as the manifest's sizes made it: they
    were measured when it was written. A read that fails leaves the footer's estimate for its
    leaves: reading the row group later reports the file as it would have.
    """
    footers = [e.metadata for e in d.files]  # every file's, as the first's (not a manifest)
    wanted = {f.name for f in d.schema if has_bytes(f.type)}
    if not wanted or footers[0] is None:  # no footer to look through (25 ms for 2,000 files
        return d  # of numbers)

    def sample(f: int, rg: int, leaves: dict[str, int]) -> dict[str, Sample]:
        owners = leaf_owners(footers[f]) or ()
        names = sorted({owners[i] for i in leaves.values()})
        part = replace(d, schema=pa.schema([d.schema.field(n) for n in names]), filter=None)
        fragment = int(np.flatnonzero((d.file_index == f) & (d.row_group == rg))[0])
        try:
            with FragmentReader(part).parquet_file(fragment,
                                                     read_dictionary=list(leaves)) as file:
                return measure(file, rg, leaves)
        except (PQLoaderError, OSError, pa.ArrowException, TypeError):
            return {}

    samples = measure_files(footers, wanted, sample)
    if not any(samples):
        return d
    per_file = [widen_row_bytes(row_bytes(md, own), d.widened[f] if d.widened else {})
                for f, (md, own) in enumerate(zip(footers, samples, strict=True))]

    ends = np.searchsorted(d.file_index, np.arange(len(footers) + 1))  # (in file order)

    def sizes(names: list[str]) -> np.ndarray:  # as _discover's index computes them
        parts = [np.zeros(0, np.int64)]
        for md, per_row, (a, b) in zip(footers, per_file, itertools.pairwise(ends), strict=True):
            assert md is not None  # every file's footer: the first's is
            encoded = [md.row_group(rg).total_byte_size for rg in d.row_group[a:b].tolist()]
            parts.append(fragments_bytes(d.num_rows[a:b], file_rows(per_row, names),
                                         np.array(encoded, dtype=np.int64)))
        return np.concatenate(parts).astype(np.int64)

    read = read_columns(d.schema.names, d.filter, d.partition_schema.names)
    return replace(d, byte_size=sizes(d.schema.names),
                   read_bytes=None if read == d.schema.names else sizes(read))
