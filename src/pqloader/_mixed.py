"""Python values of mixed kinds, which pyarrow's guess of one type from them would change: a
datetime among dates loses its time, a naive one among aware ones is taken for UTC, a str among
bytes becomes bytes. Checked for rows of dicts (``_inputs.py``) and pandas' object columns
(``_pandas.py``) alike."""

from __future__ import annotations

import datetime
from typing import Any

import numpy as np
import pyarrow as pa

from ._casts import same_values
from ._schema import holds

# Types pyarrow guesses from mixed Python values by changing some: a datetime among dates
# loses its time of day, a naive one among aware ones is taken for UTC (and the reverse drops
# the zone), a str among bytes becomes bytes, an int among timedeltas microseconds. (It
# refuses an int past 2**53 among floats itself.) A bool among floats becomes 1.0 (found by
# fuzzing; among ints pyarrow refuses it): looked for apart (ints among floats, common in rows
# from JSON, are kept, and comparing each value cost 5.5x the write, found in review).
_GUESSED = (pa.types.is_date, pa.types.is_timestamp, pa.types.is_time, pa.types.is_duration,
            pa.types.is_binary, pa.types.is_large_binary)
_BOOLS = frozenset({bool, np.bool_})


def is_guessed(t: pa.DataType) -> bool:
    return any(test(t) for test in _GUESSED)


def checked(t: pa.DataType) -> bool:
    """Whether a type guessed from Python values may have changed some (:func:`guess_kept`)."""
    return bool(holds(t, is_guessed) or holds(t, pa.types.is_floating))


def guess_kept(values: list[Any], column: pa.Array | pa.ChunkedArray, *,
               uniform: bool | None = None) -> bool:
    """Whether ``column``, pyarrow's conversion of Python ``values``, holds those values.
    ``uniform``: whether the values its type was guessed from were of one kind (None: these
    values are those)."""
    if holds(column.type, is_guessed):
        if one_kind_each(values) if uniform is None else uniform:  # nothing mixed to change:
            return True  # 7x cheaper than comparing them
    elif not (holds(column.type, pa.types.is_floating) and _has_bool(values) and not (
            one_kind_each(values) if uniform is None else uniform)):  # (a struct's bool
        return True  # field beside its float one is none: comparing cost 3x, found in review)
    try:
        return same_values(values, column.to_pylist(), column.type)
    except (ValueError, OverflowError):  # 2**62 guessed a time of day: no Python time holds
        return False  # it (found by fuzzing)


def _has_bool(values: list[Any]) -> bool:
    """Whether a bool is among ``values``, at any depth (lists, dicts)."""
    stack = [values]
    while stack:
        level = stack.pop()
        kinds = set(map(type, level))
        if kinds & _BOOLS:
            return True
        if not any(issubclass(k, (dict, list, tuple)) for k in kinds):
            continue  # flat: the common case, one pass in C
        for v in level:
            if isinstance(v, dict):
                stack.append(list(v.values()))
            elif isinstance(v, (list, tuple)):
                stack.append(list(v))
    return False


def one_kind_each(values: list[Any]) -> bool:
    """Whether the values at each place (top level, a struct's field, a list's items) are of
    one kind (type, and naive or aware), none of those pyarrow changes alone (a pandas
    Timestamp's nanoseconds, an aware time's zone)."""
    kinds = set(map(type, values))
    kinds.discard(type(None))
    if not any(issubclass(k, (dict, list, tuple)) for k in kinds):  # flat: the common case
        if len(kinds) != 1 or not hasattr(next(iter(kinds)), "tzinfo"):
            return len(kinds) <= 1  # dates, bytes, timedeltas: no zone, nothing else to lose
        kind, present = next(iter(kinds)), [v for v in values if v is not None]
        zones = {v.tzinfo is None for v in present}
        if issubclass(kind, datetime.time):
            return zones == {True}  # an aware time loses its zone
        if hasattr(kind, "nanosecond"):  # pandas Timestamps: written in microseconds
            return len(zones) == 1 and not any(v.nanosecond for v in present)
        return len(zones) == 1
    seen: dict[tuple[Any, ...], tuple[type, bool]] = {}
    stack: list[tuple[tuple[Any, ...], Any]] = [((), v) for v in values]
    while stack:
        place, v = stack.pop()
        if v is None:
            continue
        if isinstance(v, dict):
            stack.extend(((*place, k), x) for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend(((*place, None), x) for x in v)
        else:
            leaf = (type(v), getattr(v, "tzinfo", None) is None)
            if _alone_changed(v) or seen.setdefault(place, leaf) != leaf:
                return False
    return True


def _alone_changed(v: Any) -> bool:
    """A value pyarrow changes even among its own kind: a pandas Timestamp's nanoseconds
    (written in microseconds), an aware time of day (Arrow's times have no zone)."""
    return bool(getattr(v, "nanosecond", 0)) or (
        isinstance(v, datetime.time) and v.tzinfo is not None)


def kinds_said(values: list[Any]) -> str:
    kinds = []
    for v in values:
        kind = type(v).__name__ + (" with a time zone" if getattr(v, "tzinfo", None) else "")
        if v is not None and kind not in kinds:
            kinds.append(kind)
    return ", ".join(kinds)
