"""The number type that holds a column typed differently across files, exactly.

pandas writes a shard's int column as float64 where the shard had a missing value (NaN), and a
pipeline's schema grows an int into a bigint (int32 in old files, int64 in new ones): such
datasets were refused at open. Their column is read in the type that holds both types' values:
the wider int (signed beside unsigned: a signed one wider than the unsigned), the wider float, or
float64 beside ints. Each file's values are cast safely when read, so one that the type would
change (an int past 2**53 as float64) is a ``DataError`` naming the file, row group and column.
A uint64 beside a signed int has no such type, nor a bool, a decimal or a date beside a number:
those still differ.
"""

from __future__ import annotations

import pyarrow as pa

_SIGNED = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
_UNSIGNED = (pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64())
_FLOATS = (pa.float16(), pa.float32(), pa.float64())


def common_number(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The type that holds every value of number types ``a`` and ``b`` (``a`` when they are
    equal), or None (not both numbers, or no such type)."""
    if a.equals(b):
        return a if a in (*_SIGNED, *_UNSIGNED, *_FLOATS) else None
    if a in _FLOATS and b in _FLOATS:
        return _FLOATS[max(_FLOATS.index(a), _FLOATS.index(b))]
    if (a in _FLOATS and _is_int(b)) or (b in _FLOATS and _is_int(a)):
        return pa.float64()  # values past 2**53 refused at the read, by the safe cast
    if a in _SIGNED and b in _SIGNED:
        return _SIGNED[max(_SIGNED.index(a), _SIGNED.index(b))]
    if a in _UNSIGNED and b in _UNSIGNED:
        return _UNSIGNED[max(_UNSIGNED.index(a), _UNSIGNED.index(b))]
    signed, unsigned = (a, b) if a in _SIGNED else (b, a)
    if signed in _SIGNED and unsigned in _UNSIGNED:
        wider = _UNSIGNED.index(unsigned) + 1  # a signed type of twice the unsigned's bits
        if wider < len(_SIGNED):
            return _SIGNED[max(wider, _SIGNED.index(signed))]
    return None


def _is_int(t: pa.DataType) -> bool:
    return t in _SIGNED or t in _UNSIGNED


def widened_bytes(dataset: pa.DataType, file: pa.DataType) -> float:
    """How many times the bytes a file's footer gives a column of numbers (``_sizes``: 4 a
    value up to 32 bits, 2 for float16) its values take in the dataset's wider type: 2.0 for
    an int32 column read as int64, 1.0 where nothing is widened (an int8 read as int16 still
    fits the 4 bytes estimated). Nested types (lists, structs, maps) by their numbers' bytes
    together: the other leaves' bytes are not known here, so a struct of an int32 and a
    string counts as if all int32 (more, never less)."""
    if dataset.equals(file):
        return 1.0
    wide, stored = _leaf_bits(dataset, file)
    return max(1.0, wide / stored) if stored else 1.0


def _leaf_bits(dataset: pa.DataType, file: pa.DataType) -> tuple[float, float]:
    """The bits a value of each number leaf takes in the dataset's type and as stored."""
    if common_number(dataset, file) is not None:
        return float(dataset.bit_width), float(
            16 if file.equals(pa.float16()) else max(32, file.bit_width))
    if dataset.num_fields and dataset.num_fields == file.num_fields:
        pairs = [_leaf_bits(dataset.field(i).type, file.field(i).type)
                 for i in range(dataset.num_fields)]
        return sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    return 0.0, 0.0


def fits(dataset: pa.DataType, file: pa.DataType) -> bool:
    """Whether every number in ``file``'s type, at any depth, is one ``dataset``'s holds (the
    same or narrower): a file wider than the dataset would be cast down, silently."""
    number = common_number(dataset, file)
    if number is not None:
        return bool(number.equals(dataset))
    if dataset.num_fields and dataset.num_fields == file.num_fields:
        return all(fits(dataset.field(i).type, file.field(i).type)
                   for i in range(dataset.num_fields))
    return True
