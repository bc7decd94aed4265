"""Arrow columns to torch, without a per-row Python loop.

numeric (and bool, temporal as int, unsigned 16-64 bit as the next signed) -> ``Tensor[B]``;
``list<number>`` -> padded ``Tensor[B, L]`` plus ``{name}_lengths``; ``fixed_size_list<number>``
-> ``Tensor[B, L]``; string -> ``list[str]``; binary -> ``list[bytes]``. Anything else needs
``collate_fn=``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ._errors import CorruptFileError, DataError, InvalidArgumentError, bad_text

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
    for name, kind in kinds.items():  # a batch holds both under one key: one would be lost
        if kind == "list" and name + LENGTHS_SUFFIX in kinds:
            raise InvalidArgumentError(
                f"column {name + LENGTHS_SUFFIX!r} has the name of the lengths that list column "
                f"{name!r} brings to each batch; rename it, or leave one out with columns=[...]")
    return kinds


def _numeric(array: pa.ChunkedArray, name: str) -> pa.ChunkedArray:
    """A numeric column as plain values: dictionaries decoded, float nulls as NaN, time as ints."""
    t = array.type
    if pa.types.is_dictionary(t):
        t = t.value_type
        array = pa.chunked_array([c.dictionary_decode() for c in array.chunks], t)
    if array.null_count:
        if not pa.types.is_floating(t):
            cast = ", cast the column to float (nulls become NaN)" if pa.types.is_integer(t) \
                else ""  # not a timestamp's or a bool's
            raise DataError(
                f"column {name!r} ({t}) has null values ({array.null_count:,} in the "
                f"row groups named below); fill them when writing{cast}, or pass collate_fn="
            )
        array = pc.fill_null(array, pa.scalar(float("nan"), t))
    if pa.types.is_temporal(t):
        array = pc.cast(array, pa.int64() if t.bit_width == 64 else pa.int32())
    return _signed(array, name)


# torch's uint16, uint32 and uint64 tensors support few operations (no +, max, loss targets or
# embedding indices): those columns come as the next signed type that holds their values
_WIDER = {pa.uint16(): pa.int32(), pa.uint32(): pa.int64(), pa.uint64(): pa.int64()}


def _signed(array: Any, name: str) -> Any:
    """An unsigned column (or the values of a list column) as signed ints holding its values;
    a ``uint64`` value past int64's range is a DataError naming the column."""
    t = array.type
    value_type = t.value_type if pa.types.is_fixed_size_list(t) else t
    wider = _WIDER.get(value_type)
    if wider is None:
        return array
    target = pa.list_(wider, t.list_size) if pa.types.is_fixed_size_list(t) else wider
    try:
        return pc.cast(array, target)  # safe: refuses a value it cannot hold
    except pa.ArrowInvalid as exc:
        values = pc.list_flatten(array) if pa.types.is_fixed_size_list(t) else array
        raise DataError(f"column {name!r} has {value_type} values past int64's range (up to "
                        f"{pc.max(values).as_py():,}), which no torch tensor holds usefully "
                        "(torch's uint64 supports few operations); leave it out with "
                        "columns=[...], or pass collate_fn= to convert them yourself") from exc


def _as_numpy(array: pa.Array) -> np.ndarray:
    """Zero-copy numpy over an Arrow array's values; writable when Arrow allocated them here."""
    if pa.types.is_boolean(array.type):  # bit-packed: needs unpacking
        unpacked: np.ndarray = array.to_numpy(zero_copy_only=False)
        return unpacked
    dtype = np.dtype(array.type.to_pandas_dtype())
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array),
                         offset=array.offset * dtype.itemsize)


def _list_values(array: pa.FixedSizeListArray) -> pa.Array:
    """The values of a ``fixed_size_list`` array's own rows (``.values`` ignores a slice)."""
    size = array.type.list_size
    return array.values.slice(array.offset * size, len(array) * size)


def _fixed_list(array: pa.ChunkedArray, name: str) -> pa.ChunkedArray:
    """A ``fixed_size_list<number>`` column without nulls, held to the rules of :func:`_numeric`.

    Float nulls become NaN, a null list a row of NaN; integers and bools with nulls are an
    error, as in a plain column (converting them to float silently changed the batch's dtype).
    """
    t = array.type
    null_lists = array.null_count
    null_values = sum(c.flatten().null_count for c in array.chunks)  # inside non-null lists
    if not null_lists and not null_values:
        return array
    if not pa.types.is_floating(t.value_type):
        raise DataError(
            f"column {name!r} ({t}) has {null_lists:,} null lists and {null_values:,} null "
            "values inside its lists (in the row groups named below); fill them when writing, "
            "cast the values to float (nulls become NaN), or pass collate_fn="
        )
    nan = pa.scalar(float("nan"), t.value_type)
    if null_lists:
        array = pc.fill_null(array, pa.scalar([float("nan")] * t.list_size, t))
    return pa.chunked_array(
        [pa.FixedSizeListArray.from_arrays(pc.fill_null(_list_values(c), nan), type=t)
         for c in array.chunks], t)  # type=t: its values' field may say "not null"


def window_order(order: np.ndarray) -> pa.Array:
    """A window's emission order as Arrow take indices (once per window, for every column)."""
    small = len(order) < 2**32
    values = np.ascontiguousarray(order, dtype=np.uint32 if small else np.uint64)
    # from_buffers, not pa.array: pa.array(ndarray) imports pandas, 0.2-0.4 s of the first batch
    return pa.Array.from_buffers(pa.uint32() if small else pa.uint64(), len(values),
                                 [None, pa.py_buffer(values)])


def prepare(
    array: pa.ChunkedArray, name: str, kind: Kind | None, order: pa.Array | None
) -> np.ndarray | pa.Array | Ragged:
    """One window column, in emission ``order`` (``None``: as is), ready to be cut in batches.

    Numbers become numpy, the rest stays Arrow (all of it for ``kind=None``, the
    ``collate_fn=`` path). A permuted column is gathered whole, once, by Arrow's take straight
    from the row groups' chunks: one column at a time stays in cache (gathering batch by batch
    across all columns of a large window missed it on nearly every row), no concatenation
    first, and the output comes from Arrow's pool (fresh numpy arrays page-faulted: 3x slower,
    measured). Batches are then contiguous slices. ``list<number>`` columns are the exception:
    they stay in read order as a :class:`Ragged`, permuted batch by batch while padding.
    """
    if kind == "list":
        combined = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
        return Ragged.of(combined, None if order is None else order.to_numpy(), name)
    if kind == "numeric":
        array = _numeric(array, name)
    elif kind is not None and pa.types.is_dictionary(array.type):
        array = pa.chunked_array([c.dictionary_decode() for c in array.chunks],
                                 array.type.value_type)
    if kind == "fixed_list":
        array = _signed(_fixed_list(array, name), name)
    if order is not None:
        array = pc.take(array, order, boundscheck=False)
    combined = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    return _as_numpy(combined) if kind == "numeric" else combined


@dataclass(frozen=True)
class Ragged:
    """A window's ``list<number>`` column in read order, and which of its rows to emit.

    Permuting a list column with Arrow's take costs ~4 ns per value even in order (measured);
    leaving the values in place and gathering each batch's rows straight into its padded
    tensor does the permutation and the padding in one pass.
    """

    values: np.ndarray  # every row's values, in read order
    starts: np.ndarray  # int64: where each row's values start
    lengths: np.ndarray  # int64: values per row (a null list: 0)
    rows: np.ndarray  # int64: the rows to emit, in order

    @classmethod
    def of(cls, array: pa.ListArray | pa.LargeListArray, order: np.ndarray | None,
           name: str) -> Ragged:
        # float nulls become NaN (to_numpy makes them so), as in a plain float column
        if array.flatten().null_count and not pa.types.is_floating(array.type.value_type):
            raise DataError(f"column {name!r} ({array.type}) has null values inside its lists; "
                            "fill them when writing, cast the values to float (nulls become "
                            "NaN), or pass collate_fn=")
        lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
        # .values are the unsliced array's: a window is a slice of its row groups (a rank's
        # share), and a null outside it made the ints floats, bools objects (found in review)
        offsets = array.offsets.to_numpy().astype(np.int64)
        first = int(offsets[0])
        inside = array.values.slice(first, int(offsets[-1]) - first)
        if inside.null_count and not pa.types.is_floating(inside.type):
            # under null lists (never emitted: length 0)
            inside = pc.fill_null(inside, pa.scalar(0).cast(inside.type))
        values = _signed(inside, name).to_numpy(zero_copy_only=False)
        starts = offsets[:-1] - first
        rows = np.arange(len(array), dtype=np.int64) if order is None else order.astype(np.int64)
        return cls(values, starts, lengths.astype(np.int64), rows)

    def __len__(self) -> int:
        return len(self.rows)

    def slice(self, offset: int, length: int) -> Ragged:
        return Ragged(self.values, self.starts, self.lengths, self.rows[offset:offset + length])

    def gather(self) -> tuple[np.ndarray, np.ndarray]:
        """The emitted rows' values, concatenated, and their lengths: a view of the values
        where the rows are a run in read order, and theirs lie side by side (unshuffled, and
        a batch joined across windows: gathered again value by value, a batch of 65,536 token
        lists ran at 0.25x the floor, found in review)."""
        rows = self.rows
        if len(rows) and rows[-1] - rows[0] == len(rows) - 1 and (
                len(rows) == 1 or bool((rows[1:] - rows[:-1] == 1).all())):
            a, b = int(rows[0]), int(rows[-1]) + 1
            lengths = self.lengths[a:b]
            begin, end = int(self.starts[a]), int(self.starts[b - 1] + lengths[-1])
            if end - begin == int(lengths.sum()):  # (a null list's offsets may span values)
                return self.values[begin:end], lengths
        lengths = self.lengths[self.rows]
        first = np.cumsum(lengths) - lengths  # where each row goes in the flat output
        index = np.arange(int(lengths.sum())) + np.repeat(self.starts[self.rows] - first, lengths)
        return self.values[index], lengths

    @staticmethod
    def concat(parts: list[Ragged]) -> RaggedParts:
        """Rows of several windows (a batch across reads), padded part by part: joined
        first, their values were copied once more before the pad (a batch of 65,536 token
        lists across 4 reads at 0.8x a slice-and-pad floor; 1.03x padded from the parts)."""
        return RaggedParts(tuple(parts))


@dataclass(frozen=True)
class RaggedParts:
    """A batch's list column made of several windows' rows (see :meth:`Ragged.concat`)."""

    parts: tuple[Ragged, ...]

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)


def _padded(ragged: Ragged | RaggedParts, name: str) -> dict[str, torch.Tensor]:
    parts = ragged.parts if isinstance(ragged, RaggedParts) else (ragged,)
    gathered = [p.gather() for p in parts]
    lengths = gathered[0][1] if len(gathered) == 1 else np.concatenate([g[1] for g in gathered])
    width = int(lengths.max()) if len(lengths) else 0
    out = np.zeros((len(lengths), width), dtype=np.result_type(*(g[0].dtype for g in gathered)))
    at = 0
    for flat, part in gathered:  # each part's rows padded in place, its values never joined
        out[at:at + len(part)][np.arange(width) < part[:, None]] = flat
        at += len(part)
    return {name: torch.from_numpy(out), name + LENGTHS_SUFFIX: torch.from_numpy(
        lengths.astype(np.int64))}


def _tensor(values: np.ndarray) -> torch.Tensor:
    if not values.flags.writeable:  # Arrow memory that is not ours to hand out writable
        values = values.copy()
    return torch.from_numpy(values)


def to_torch(columns: Mapping[str, Any], kinds: Mapping[str, Kind]) -> dict[str, Any]:
    """A batch of gathered columns as the dict users see."""
    batch: dict[str, Any] = {}
    for name, values in columns.items():
        kind = kinds[name]
        if kind == "numeric":  # (_tensor inline: a call per column and batch, ~0.1 us)
            batch[name] = torch.from_numpy(values if values.flags.writeable else values.copy())
        elif kind == "list":
            batch.update(_padded(values, name))
        elif kind == "fixed_list":  # no nulls left (prepare); a batch is a slice: mind offset
            flat = _list_values(values)
            flat_np = _as_numpy(flat) if len(flat) else np.zeros(0, flat.type.to_pandas_dtype())
            batch[name] = _tensor(flat_np.reshape(len(values), values.type.list_size))
        else:
            batch[name] = _texts(values, name)
    return batch


def _texts(values: pa.Array, name: str) -> list[Any]:
    """A column of strings (or other values) as Python's."""
    try:
        out: list[Any] = values.to_pylist()
    except UnicodeDecodeError as exc:  # was raised bare: no file, row group or column
        told = CorruptFileError(bad_text(name, exc))
        setattr(told, "row", _bad_row(values))  # noqa: B010  (finish names its row group)
        raise told from exc
    return out


def _bad_row(values: pa.Array) -> int | None:
    """The first row of ``values`` whose text is not UTF-8, as Arrow's validation tells it
    (the batch's rows mix hundreds of row groups: the error named 8 and "120 more", not the
    one at fault: found by fuzzing)."""
    try:
        values.validate(full=True)
    except pa.ArrowInvalid as exc:
        if found := re.search(r"Invalid UTF8 sequence at string index (\d+)", str(exc)):
            return int(found[1])
    return None


def to_arrow(columns: Mapping[str, pa.Array]) -> pa.RecordBatch:
    """A batch of columns prepared with ``kind=None`` as an Arrow record batch."""
    return pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))
