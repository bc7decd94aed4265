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
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


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


def _numeric_numpy(array: pa.Array, name: str) -> np.ndarray:
    t = array.type
    if pa.types.is_dictionary(t):
        array, t = array.dictionary_decode(), t.value_type
    if array.null_count and not pa.types.is_floating(t):
        raise DataError(
            f"column {name!r} ({t}) has {array.null_count} null values; fill them when "
            "writing, cast the column to float (nulls become NaN), or pass collate_fn="
        )
    if pa.types.is_temporal(t):
        array = pc.cast(array, pa.int64() if t.bit_width == 64 else pa.int32())
    values: np.ndarray = array.to_numpy(zero_copy_only=False)
    return values


def prepare(
    array: pa.ChunkedArray, name: str, kind: Kind | None, order: np.ndarray | None
) -> np.ndarray | pa.Array:
    """One window column, in emission ``order`` (``None``: as is), ready to be cut in batches.

    Numbers become numpy, the rest stays Arrow (all of it for ``kind=None``, the
    ``collate_fn=`` path). A permuted column is gathered whole, once: one column at a time stays
    in cache, where gathering batch by batch across all columns of a large window would miss it
    on nearly every row. Batches are then contiguous slices.
    """
    if kind != "numeric":
        combined = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
        if kind is not None and pa.types.is_dictionary(combined.type):
            combined = combined.dictionary_decode()
        return combined if order is None else combined.take(pa.array(order))
    chunks = [_numeric_numpy(c, name) for c in array.chunks]
    values = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
    return values if order is None else np.take(values, order)


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


def compact(batch: Any) -> Any:
    """Copy tensors that view a larger buffer (a window), before they cross a process boundary.

    In one process a batch's tensors are views into its permuted window: free to make. Sent to
    another process, a view would ship its whole window buffer, so it is cloned first.
    """
    if isinstance(batch, torch.Tensor):
        if batch.untyped_storage().nbytes() > batch.nbytes:
            return batch.clone()
        return batch
    if isinstance(batch, dict):
        return {k: compact(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], torch.Tensor):
        return type(batch)(compact(v) for v in batch)
    return batch
