"""Decoded sizes from footers: the Arrow memory a row of each column takes, without reading it.

Shuffle windows are sized in decoded bytes. A footer's ``total_byte_size`` counts the encoded
pages: a dictionary-encoded column's dictionary plus its packed indices, which is 0.73x the
decoded size of W1's float32 columns and 0.5x that of W2's token lists (measured). For values of
a fixed width, the decoded size is exact from the value count: ``num_values`` (nulls included,
as Arrow keeps their slots) times the width, plus a 4-byte offset per row for each list level.
Strings and binaries keep their encoded size (at least a 4-byte offset per value): their
lengths are not in the footer.
"""

from __future__ import annotations

import pyarrow.parquet as pq

RowBytes = dict[str, float]  # top-level column -> decoded bytes per row

_WIDTH = {"BOOLEAN": 0.125, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8,
          "INT96": 8}  # INT96 timestamps decode to 8-byte ones


def row_bytes(md: pq.FileMetaData) -> RowBytes | None:
    """Decoded bytes per row of each top-level column, from the file's largest row group
    (``None`` for a file without rows)."""
    if md.num_row_groups == 0:
        return None
    rg = max((md.row_group(i) for i in range(md.num_row_groups)), key=lambda g: g.num_rows)
    if rg.num_rows == 0:
        return None
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
        size += 4 * rg.num_rows * leaf.max_repetition_level  # list offsets
        name = chunk.path_in_schema.split(".", 1)[0]
        out[name] = out.get(name, 0.0) + size / rg.num_rows
    return out


def fragment_bytes(rows: int, per_row: RowBytes | None, columns: list[str],
                   encoded: int) -> int:
    """A row group's decoded size for ``columns`` (those the file has); ``encoded`` (the
    footer's ``total_byte_size``) where the per-row sizes are unknown."""
    if per_row is None:
        return encoded
    return int(rows * sum(per_row.get(c, 8.0) for c in columns))  # else: a partition column
