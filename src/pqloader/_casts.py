"""Type changes that keep every value: what ``write_dataset`` makes of its input's types to
fit the first batch's or ``schema=``, and nothing more.

Arrow's cast, even ``safe``, parses text (``"007"`` into the int 7), formats numbers as text,
turns bools into ints, rounds floats into decimals and drops struct fields the target lacks.
Only changes within one kind of value are made here: integers, floats and decimals into
each other where Arrow's safe cast refuses a value that would not fit, or lose its fraction
or its precision (not ints into float16, not floats and decimals into each other), floats
narrowed (never to infinity, at any depth; rounded to the nearest value only into a type
``schema=`` asked for, else where each value stays exactly what it was), other string,
binary and list layouts, timestamp units (refused where they would truncate), dates as
timestamps and back (a time of day refused), dictionaries of the same values, structs of
the same fields.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_t = pa.types
_STRINGS = (_t.is_string, _t.is_large_string, _t.is_string_view)
_BINARIES = (_t.is_binary, _t.is_large_binary, _t.is_binary_view)
_LISTS = (_t.is_list, _t.is_large_list, _t.is_fixed_size_list, _t.is_list_view,
          _t.is_large_list_view)


def _any(tests: tuple[Callable[[pa.DataType], bool], ...], t: pa.DataType) -> bool:
    return any(test(t) for test in tests)


def keeps_values(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether a (safe) cast from ``src`` to ``dst`` leaves each value what it was."""
    if src.equals(dst) or _t.is_null(src):
        return True
    if _t.is_dictionary(src) or _t.is_dictionary(dst):
        unwrap = [t.value_type if _t.is_dictionary(t) else t for t in (src, dst)]
        return keeps_values(unwrap[0], unwrap[1])
    if _t.is_integer(src) or _t.is_floating(src) or _t.is_decimal(src):
        # a safe cast refuses what would not fit, or truncate (2.5 into int); not an int as
        # float16 (Arrow checks no range there: 70,000 became inf), nor a float as a decimal
        # (rounded) or a decimal as a float (1.000000001 as 1.0)
        if _t.is_decimal(src) or _t.is_decimal(dst):
            return bool(_t.is_decimal(dst) or _t.is_integer(dst)) and not _t.is_floating(src)
        return bool(_t.is_integer(dst) or (_t.is_floating(dst) and not (
            _t.is_integer(src) and _t.is_float16(dst))))
    if _t.is_boolean(src):
        return bool(_t.is_boolean(dst))
    if _t.is_date(src) and _t.is_timestamp(dst):
        return dst.tz is None  # midnight of that day, exactly
    if _t.is_timestamp(src) and src.tz is None and _t.is_date(dst):
        return True  # checked by cast_exactly: a time of day is refused, not dropped
    for group in (_STRINGS, _BINARIES):
        if _any(group, src):
            return _any(group, dst)
    for kind in (_t.is_timestamp, _t.is_duration, _t.is_time, _t.is_date):
        if kind(src):  # a timestamp with a time zone and one without: other instants
            return bool(kind(dst)) and (not _t.is_timestamp(src) or
                                        (src.tz is None) == (dst.tz is None))
    if _any(_LISTS, src) and _any(_LISTS, dst):
        return keeps_values(src.value_type, dst.value_type)
    if _t.is_struct(src) and _t.is_struct(dst):
        theirs = {dst.field(i).name: dst.field(i).type for i in range(dst.num_fields)}
        mine = {src.field(i).name: src.field(i).type for i in range(src.num_fields)}
        return set(mine) <= set(theirs) and all(keeps_values(t, theirs[n]) for n, t in mine.items())
    if _t.is_map(src) and _t.is_map(dst):
        return keeps_values(src.key_type, dst.key_type) and \
            keeps_values(src.item_type, dst.item_type)
    return False


def cast_exactly(array: pa.Array | pa.ChunkedArray, dst: pa.DataType, *,
                 round_floats: bool = True) -> pa.Array | pa.ChunkedArray:
    """``array`` as ``dst``, or ``ValueError`` saying why that would change its values.
    ``round_floats``: floats narrowed are rounded to the nearest value (``dst`` was asked for:
    ``schema=``); else one that would change is refused (``dst`` is the first batch's)."""
    src = array.type
    if not keeps_values(src, dst):
        raise ValueError(f"{src} cannot become {dst} value for value (a cast would parse, "
                         "format, round or drop them)")
    out = array.cast(dst, safe=True)
    if _has(dst, _t.is_floating) and _infs(out) != _infs(array):
        raise ValueError(f"a value of {src} is too large for {dst} (it would become inf)")
    if not round_floats and _has(dst, _t.is_floating) and not _floats_kept(array, out):
        raise ValueError(f"a value of {src} would be rounded as {dst}")
    if _t.is_timestamp(src) and _t.is_date(dst) and not out.cast(src).equals(array):
        raise ValueError(f"a value of {src} has a time of day, which {dst} would drop")
    return out


def _has(t: pa.DataType, test: Callable[[pa.DataType], bool]) -> bool:
    if test(t):
        return True
    if _t.is_dictionary(t):
        return _has(t.value_type, test)
    return any(_has(t.field(i).type, test) for i in range(t.num_fields))


def _floats_kept(before: pa.Array | pa.ChunkedArray, after: pa.Array | pa.ChunkedArray) -> bool:
    """Whether ``after``, a cast of ``before``, holds each of its floats exactly (NaN as NaN),
    at any depth: checked only where the cast narrows a float (not ints, nulls, or fields the
    cast adds), by casting back and comparing the float leaves of one type."""
    if not _narrows(before.type, after.type):
        return True
    try:
        back = after.cast(before.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    for a, b in zip(_floats(before), _floats(back), strict=True):  # one type: leaves align
        same = pc.or_kleene(pc.equal(a, b), pc.and_(pc.is_nan(a), pc.is_nan(b)))
        if not pc.all(pc.fill_null(same, True)).as_py():
            return False
    return True


def _narrows(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether a cast from ``src`` to ``dst`` makes some float of ``src`` a narrower one."""
    if _t.is_dictionary(src) or _t.is_dictionary(dst):
        return _narrows(*(t.value_type if _t.is_dictionary(t) else t for t in (src, dst)))
    if _t.is_floating(src):
        return bool(_t.is_floating(dst) and dst.bit_width < src.bit_width)
    if _any(_LISTS, src) and _any(_LISTS, dst):
        return _narrows(src.value_type, dst.value_type)
    if _t.is_map(src) and _t.is_map(dst):
        return _narrows(src.key_type, dst.key_type) or _narrows(src.item_type, dst.item_type)
    if _t.is_struct(src) and _t.is_struct(dst):
        theirs = {dst.field(i).name: dst.field(i).type for i in range(dst.num_fields)}
        return any(_narrows(src.field(i).type, theirs[src.field(i).name])
                   for i in range(src.num_fields) if src.field(i).name in theirs)
    return False


def _floats(array: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    """The leaf arrays of ``array`` that hold floats (as _infs walks them)."""
    if isinstance(array, pa.ChunkedArray):
        return [leaf for chunk in array.chunks for leaf in _floats(chunk)]
    t = array.type
    if _t.is_floating(t):
        return [array]
    if _t.is_dictionary(t):
        return _floats(array.dictionary_decode())
    if _t.is_map(t):
        start, stop = array.offsets[0].as_py(), array.offsets[-1].as_py()
        return _floats(array.keys.slice(start, stop - start)) + \
            _floats(array.items.slice(start, stop - start))
    if _any(_LISTS, t):
        return _floats(array.flatten())
    if _t.is_struct(t):
        return [leaf for child in array.flatten() for leaf in _floats(child)]
    return []


def _infs(array: pa.Array | pa.ChunkedArray) -> int:
    """Infinite values in ``array``, at any depth (lists, structs, maps, dictionaries)."""
    if isinstance(array, pa.ChunkedArray):
        return sum(_infs(chunk) for chunk in array.chunks)
    t = array.type
    if _t.is_floating(t):
        return int(pc.sum(pc.is_inf(array)).as_py() or 0)
    if _t.is_dictionary(t):
        return _infs(array.dictionary_decode())
    if _t.is_map(t):  # (its keys and items hold every slice's: this one's are between these)
        start, stop = array.offsets[0].as_py(), array.offsets[-1].as_py()
        return _infs(array.keys.slice(start, stop - start)) + \
            _infs(array.items.slice(start, stop - start))
    if _any(_LISTS, t):
        return _infs(array.flatten())  # (not .values: a slice's own values)
    if _t.is_struct(t):
        return sum(_infs(child) for child in array.flatten())
    return 0


def same_values(given: list[Any], got: list[Any], t: pa.DataType) -> bool:
    """Whether Python values ``got`` back from an Arrow array of ``t`` are those ``given``."""
    return len(given) == len(got) and all(_same(a, b, t) for a, b in zip(given, got, strict=True))


def _same(a: Any, b: Any, t: pa.DataType) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if _t.is_map(t):
        items = list(a.items()) if isinstance(a, dict) else list(a)
        return len(items) == len(b) and all(
            _same(k, kb, t.key_type) and _same(v, vb, t.item_type)
            for (k, v), (kb, vb) in zip(items, b, strict=True))
    if _t.is_struct(t):
        return isinstance(a, dict) and set(a) <= {t.field(i).name for i in range(t.num_fields)} \
            and all(_same(a.get(t.field(i).name), b.get(t.field(i).name), t.field(i).type)
                    for i in range(t.num_fields))
    if _any(_LISTS, t):
        return len(a) == len(b) and all(_same(x, y, t.value_type)
                                        for x, y in zip(a, b, strict=True))
    if isinstance(a, (float, np.floating)) and math.isnan(a):
        return isinstance(b, (float, np.floating)) and math.isnan(b)
    if isinstance(a, (bool, np.bool_)) or isinstance(b, (bool, np.bool_)):  # True is not 1
        return isinstance(a, (bool, np.bool_)) and isinstance(b, (bool, np.bool_)) and \
            bool(a) == bool(b)
    return bool(a == b)
