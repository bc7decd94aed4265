"""One schema for many files: their footers' schemas unified, hive partition folders typed."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from pathlib import PurePath
from typing import TYPE_CHECKING
from urllib.parse import unquote

import pyarrow as pa

from ._errors import ColumnNotFoundError, SchemaMismatchError
from ._widen import common_number

if TYPE_CHECKING:
    from ._discover import FileEntry

_INT_TEXT = re.compile(r"-?[0-9]+")  # ASCII only: str.isdigit() also accepts '²'


def hive_partition(path: PurePath, root: PurePath | None) -> tuple[tuple[str, str | None], ...]:
    if root is None or "=" not in str(path):  # no key=value folder: skip pathlib (~15 us)
        return ()
    parts = []
    for part in path.relative_to(root).parent.parts:
        key, sep, value = part.partition("=")
        if sep and key:
            decoded = unquote(value)
            parts.append((key, None if decoded == "__HIVE_DEFAULT_PARTITION__" else decoded))
    return tuple(parts)


def _is_int64_text(value: str) -> bool:
    """Whether a hive folder's value is an int64 written as its integer is: ``7``, ``-3``;
    not ``007``, ``+7`` or ``-0``. Taken for ints, ``store=007`` and ``store=7`` became one
    value, and ``zip=01234`` lost its zero, which ``pqloader write`` then wrote out (found
    in review): such folders' values stay text."""
    return bool(_INT_TEXT.fullmatch(value)) and -(2**63) <= int(value) < 2**63 \
        and str(int(value)) == value


def partition_schema(entries: Sequence[FileEntry]) -> pa.Schema:
    keys = [k for k, _ in entries[0].partition]
    for entry in entries[1:]:
        other = [k for k, _ in entry.partition]
        if other != keys:
            raise SchemaMismatchError(
                f"{entry.path}: hive partition folders {other} differ from {keys} in "
                f"{entries[0].path}; every file must sit at the same partition depth"
            )
    fields = []
    for i, key in enumerate(keys):
        values = [e.partition[i][1] for e in entries]
        present = [v for v in values if v is not None]
        is_int = bool(present) and all(_is_int64_text(v) for v in present)
        fields.append(pa.field(key, pa.int64() if is_int else pa.string()))
    return pa.schema(fields)


# Layouts of the same values: 32-bit offsets or 64-bit (pandas 2 writes string, pandas 3
# large_string). Files of both make one dataset, read in the large layout.
def _is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _is_bytes(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))


_LAYOUTS = (_is_text, _is_bytes)
_UNITS = ("s", "ms", "us", "ns")


def _is_varlist(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Types equal up to the names of list elements (Spark says 'element', pyarrow 'item'),
    the nullability of nested fields (Spark's ``containsNull=false`` in one job's files only),
    the offsets' width (``string`` and ``large_string``, ``list`` and ``large_list``),
    timestamps' units (of one time zone) and numbers' widths (``_widen.py``: int32 beside
    int64, int64 beside float64), with ``null`` (the type pandas gives an object column
    without a value, as in an empty shard) matching any type: :func:`looser` makes one type
    of the two."""
    if a.equals(b) or pa.types.is_null(a) or pa.types.is_null(b):
        return True  # null: no values (an empty object column from pandas), so any type's
    if pa.types.is_dictionary(a) or pa.types.is_dictionary(b):  # pandas' categories: codes
        return same_type(_values(a), _values(b))  # of 8-32 bits by their count, or plain
    if common_number(a, b) is not None:
        return True
    for kind in _LAYOUTS:  # string and large_string: the same values (pandas 3 writes large)
        if kind(a) and kind(b):
            return True
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b):  # units: Spark's INT96 (read
        return bool(a.tz == b.tz)  # in us) beside pandas' ns; read in the finer one, exactly
    if _is_varlist(a) and _is_varlist(b):  # list and large_list
        return same_type(a.value_type, b.value_type)
    if pa.types.is_fixed_size_list(a) and pa.types.is_fixed_size_list(b):
        return a.list_size == b.list_size and same_type(a.value_type, b.value_type)
    if pa.types.is_map(a) and pa.types.is_map(b):
        return (a.keys_sorted == b.keys_sorted and same_type(a.key_type, b.key_type)
                and same_type(a.item_type, b.item_type))
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        return [f.name for f in a] == [f.name for f in b] and all(
            same_type(x.type, y.type) for x, y in zip(a, b, strict=True))
    return False


def looser(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    """``a`` (:func:`same_type` as ``b``) with each nested field nullable where ``b``'s is: the
    type both files' values fit (casting to ``a`` declared a list's elements not null while the
    other file's held nulls), the other's type where one is ``null``, the large layout where
    one is large (``large_string`` for ``string``)."""
    if pa.types.is_null(a):
        return b
    if pa.types.is_null(b):  # (beside a dictionary, a file typed null first or last made it a
        return a  # dictionary or plain values: found by fuzzing)
    if pa.types.is_dictionary(a) or pa.types.is_dictionary(b):
        values = looser(_values(a), _values(b))
        if not (pa.types.is_dictionary(a) and pa.types.is_dictionary(b)):
            return values  # categories beside plain values: read plain
        index = max(a.index_type, b.index_type, key=lambda t: t.bit_width)
        return pa.dictionary(index, values, a.ordered and b.ordered)
    if (pa.types.is_string(a) and pa.types.is_large_string(b)) or (
            pa.types.is_binary(a) and pa.types.is_large_binary(b)):
        return b
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b):  # (a value past the finer
        return a if _UNITS.index(a.unit) >= _UNITS.index(b.unit) else b  # unit's range: named)
    if (number := common_number(a, b)) is not None:  # (a value it would change: named)
        return number
    if a.equals(b) or a.num_fields == 0 or a.num_fields != b.num_fields:
        return a
    fields = [_looser_field(a.field(i), b.field(i)) for i in range(a.num_fields)]
    if pa.types.is_struct(a):
        return pa.struct(fields)
    if pa.types.is_map(a):
        key, item = fields[0].type.field(0), fields[0].type.field(1)  # the entries struct
        return pa.map_(key, item, a.keys_sorted)
    if pa.types.is_fixed_size_list(a):
        return pa.list_(fields[0], a.list_size)
    if pa.types.is_large_list(a) or pa.types.is_large_list(b):
        return pa.large_list(fields[0])
    if pa.types.is_list(a):
        return pa.list_(fields[0])
    return a


def _values(t: pa.DataType) -> pa.DataType:
    """A dictionary's values' type; any other type as it is."""
    return t.value_type if pa.types.is_dictionary(t) else t


def _looser_field(a: pa.Field, b: pa.Field) -> pa.Field:
    return a.with_type(looser(a.type, b.type)).with_nullable(a.nullable or b.nullable)


def holds(t: pa.DataType, test: Callable[[pa.DataType], bool]) -> bool:
    """Whether ``t``, or a type in its lists, structs, maps or dictionary, passes ``test``."""
    if test(t):
        return True
    if pa.types.is_dictionary(t):
        return holds(t.value_type, test)
    return any(holds(t.field(i).type, test) for i in range(t.num_fields))


def rebuilt(t: pa.DataType, leaf: Callable[[pa.DataType], pa.DataType]) -> pa.DataType:
    """``t`` with ``leaf`` applied to each type in it without children, at any depth (a
    struct's fields, a list's values, a map's keys and items, a dictionary's values); names,
    nullability and the rest kept."""
    if pa.types.is_dictionary(t) or t.num_fields:
        return with_children(t, lambda child: rebuilt(child, leaf))
    return leaf(t)


def with_children(t: pa.DataType, child: Callable[[pa.DataType], pa.DataType]
                   ) -> pa.DataType:
    """``t`` with ``child`` applied to the type of each of its children (one level)."""
    if pa.types.is_dictionary(t):
        return pa.dictionary(t.index_type, child(t.value_type), t.ordered)
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(child(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(child(t.key_type)),
                       t.item_field.with_type(child(t.item_type)), t.keys_sorted)
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(child(t.value_type)), t.list_size)
    kinds = ((pa.types.is_large_list, pa.large_list), (pa.types.is_list, pa.list_),
             (pa.types.is_list_view, pa.list_view),
             (pa.types.is_large_list_view, pa.large_list_view))
    for test, make in kinds:
        if test(t):
            return make(t.value_field.with_type(child(t.value_type)))
    return t  # unions...: left as they are, refused or passed on as before


def field_index(schema: pa.Schema, name: str, path: str) -> int:
    """The index of column ``name`` in ``path``'s ``schema``; -1 when it has none; an error
    when it has several (pyarrow's own lookup says -1 then, and "not in" would be a lie)."""
    i: int = schema.get_field_index(name)
    if i < 0 and schema.get_all_field_indices(name):
        raise SchemaMismatchError(
            f"column {name!r} appears {len(schema.get_all_field_indices(name))} times in "
            f"{path}; pqloader needs each name once: rename them when writing, or read the "
            "other columns with columns=[...]")
    return i


def typed_first(schemas: Sequence[tuple[str, pa.Schema]]) -> pa.Schema:
    """The first file's schema, each column in the type the files it is in unify to (what a
    filter is checked against): a column typed ``null`` there takes the others' type (a null
    column has no kernels, and hides that its values are floats), a float16 one the float32
    of another file (``x > 1`` has no float16 kernel: the filter was refused, or not, by the
    files' order; found in review). A type :func:`same_type` refuses is left as it is: the
    unification names it."""
    first = schemas[0][1]
    if all(s.equals(first) for _, s in schemas[1:]):
        return first
    fields = []
    for field in first:
        for _, schema in schemas[1:]:
            i = schema.get_field_index(field.name)
            if i >= 0 and same_type(field.type, (other := schema.field(i).type)):
                field = field.with_type(looser(field.type, other))
        fields.append(field)
    return pa.schema(fields)


def unify(schemas: Sequence[tuple[str, pa.Schema]], columns: Sequence[str] | None,
          partitions: Sequence[str] = ()) -> pa.Schema:
    """One schema for ``(path, schema)`` pairs, or an error naming two files that disagree
    (``partitions``: the hive folders' columns, named where a column is not found)."""
    first, base = schemas[0][0], schemas[0][1].remove_metadata()
    names = list(base.names) if columns is None else list(columns)
    for name in names:
        if field_index(base, name, first) < 0:
            known = [*base.names, *partitions]
            close = difflib.get_close_matches(name, known, n=1)
            folders = f" and its hive folders' {list(partitions)}" if partitions else ""
            raise ColumnNotFoundError(
                f"column {name!r} is not in {first}; its columns are {base.names}{folders}"
                + (f": did you mean {close[0]!r}?" if close else ""))
    fields = [base.field(n) for n in names]
    typed_in = [first] * len(fields)  # the file each field's type comes from, for messages
    last = base
    for path, schema in schemas[1:]:
        if schema.equals(last):  # most files: the same columns as the last one, unified
            continue  # already (200 files of 1,000 columns took 1.1 s, one by one)
        last = schema
        if columns is None:
            extra = sorted(set(schema.names) - set(names))
            if extra:
                raise SchemaMismatchError(
                    f"{path} has column {extra[0]!r} that {first} lacks; "
                    "pass columns=[...] to read the columns they share"
                )
        for k, field in enumerate(fields):
            i = field_index(schema, field.name, path)
            if i < 0:
                raise SchemaMismatchError(
                    f"{path} lacks column {field.name!r} that {first} has; "
                    "pass columns=[...] to read the columns they share"
                )
            other = schema.field(i).type
            if not same_type(field.type, other):
                raise SchemaMismatchError(
                    f"column {field.name!r} is {field.type} in {typed_in[k]} but {other} in "
                    f"{path}; cast it when writing, or leave it out with columns=[...]"
                )
            if pa.types.is_null(field.type) and not pa.types.is_null(other):
                typed_in[k] = path
            # a column (or a field in it) "not null" in the first file but nullable in another
            # is nullable: the other's nulls must not fail, or hide in, the cast to the schema
            fields[k] = _looser_field(field, schema.field(i))
    return pa.schema(fields)
