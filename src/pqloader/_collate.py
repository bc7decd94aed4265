"""Arrow columns to torch, without a per-row Python loop.

numeric (and bool, temporal as int) -> ``Tensor[B]``; ``list<number>`` -> padded ``Tensor[B, L]``
plus ``{name}_lengths``; ``fixed_size_list<number>`` -> ``Tensor[B, L]``; string -> ``list[str]``;
binary -> ``list[bytes]``. Anything else needs ``collate_fn=``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ._errors import DataError, InvalidArgumentError

Kind = Literal["numeric", "list", "fixed_list", "str", "bytes"]
LENGTHS_SUFFIX = "_lengths"


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def column_kind(field: pa.Field) -> Kind | None:
    """How a column becomes part of a batch, or ``None`` when it cannot by default."""
    t = field.type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if _is_number(t) or pa.types.is_temporal(t):
        return "numeric"
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and _is_number(t.value_type):
        return "list"
    if pa.types.is_fixed_size_list(t) and _is_number(t.value_type):
        return "fixed_list"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "str"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytes"
    return None


def column_kinds(schema: pa.Schema) -> dict[str, Kind]:
    """Each column's kind; raises naming the first column no batch can hold."""
    kinds: dict[str, Kind] = {}
    for field in schema:
        kind = column_kind(field)
        if kind is None:
            raise InvalidArgumentError(
                f"column {field.name!r} has type {field.type}, which pqloader cannot turn into "
                "tensors; leave it out with columns=[...] or convert it yourself with collate_fn="
            )
        kinds[field.name] = kind
    return kinds


def prepare(
    array: pa.ChunkedArray | pa.Array, name: str, kind: Kind | None
) -> np.ndarray | pa.Array:
    """One window column in the form batches are gathered from: numpy for numbers, else Arrow.

    ``kind=None`` keeps every column as Arrow, for ``collate_fn=``.
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    if kind is None:
        return array
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if kind != "numeric":
        return array
    t = array.type
    if array.null_count and not pa.types.is_floating(t):
        raise DataError(
            f"column {name!r} ({t}) has {array.null_count} null values; fill them when "
            "writing, cast the column to float (nulls become NaN), or pass collate_fn="
        )
    if pa.types.is_temporal(t):
        array = pc.cast(array, pa.int64() if t.bit_width == 64 else pa.int32())
    return array.to_numpy(zero_copy_only=False)


def _padded(array: pa.Array, name: str) -> dict[str, torch.Tensor]:
    lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
    values = array.flatten()
    if values.null_count:
        raise DataError(f"column {name!r} has null values inside its lists; fill them first")
    flat = values.to_numpy(zero_copy_only=False)
    width = int(lengths.max()) if len(lengths) else 0
    out = np.zeros((len(lengths), width), dtype=flat.dtype)
    out[np.arange(width) < lengths[:, None]] = flat
    return {name: torch.from_numpy(out), name + LENGTHS_SUFFIX: torch.from_numpy(
        lengths.astype(np.int64))}


def _tensor(values: np.ndarray) -> torch.Tensor:
    if not values.flags.writeable:  # zero-copy views of Arrow memory are read-only
        values = values.copy()
    return torch.from_numpy(values)


def to_torch(columns: Mapping[str, Any], kinds: Mapping[str, Kind]) -> dict[str, Any]:
    """A batch of gathered columns as the dict users see."""
    batch: dict[str, Any] = {}
    for name, values in columns.items():
        kind = kinds[name]
        if kind == "numeric":
            batch[name] = _tensor(values)
        elif kind == "list":
            batch.update(_padded(values, name))
        elif kind == "fixed_list":
            flat = values.flatten().to_numpy(zero_copy_only=False)
            batch[name] = _tensor(flat.reshape(len(values), values.type.list_size))
        else:
            batch[name] = values.to_pylist()
    return batch


def to_arrow(columns: Mapping[str, pa.Array]) -> pa.RecordBatch:
    """A batch of columns prepared with ``kind=None`` as an Arrow record batch."""
    return pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))
