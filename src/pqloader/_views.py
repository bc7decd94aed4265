"""Views (``string_view``, ``binary_view``, ``list_view``: what pyarrow and Polars may write)
read as the types they view: Arrow's take, filters and the collation have no kernels for them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ._errors import DataError
from ._schema import holds, with_children


def unviewed(schema: pa.Schema) -> pa.Schema:
    """``schema`` with string and binary views (``string_view``: what pyarrow and Polars may
    write) as ``large_string`` and ``large_binary``, and list views as lists, at any depth:
    what pqloader reads them into (Arrow's take, filters and the collation have no kernels
    for views). The last schema's answer where it is the same (4 ms a file of 1,000 columns,
    at the open and at each file's first read)."""
    global _LAST
    last = _LAST  # (a footer's schema is shared by a run of files alike: the same object)
    if last is not None and (schema is last[0] or schema.equals(last[0], check_metadata=True)):
        return schema if last[1] is last[0] else last[1]
    out = schema
    if any(_has_view(t) for t in schema.types):
        out = pa.schema([f.with_type(_unview(f.type)) for f in schema], metadata=schema.metadata)
    _LAST = (schema, out)  # (replaced whole: read in threads)
    return out


_LAST: tuple[pa.Schema, pa.Schema] | None = None  # (a schema, unviewed's answer)


def _is_view(t: pa.DataType) -> bool:
    return bool(pa.types.is_string_view(t) or pa.types.is_binary_view(t)
                or pa.types.is_list_view(t) or pa.types.is_large_list_view(t))


def _has_view(t: pa.DataType) -> bool:
    return holds(t, _is_view)


def _unview(t: pa.DataType) -> pa.DataType:
    """``t`` with views as the types they view, at any depth (list views as lists: token
    columns written as views were refused, found in review)."""
    if not _has_view(t):
        return t
    if pa.types.is_list_view(t):
        return pa.list_(t.value_field.with_type(_unview(t.value_type)))
    if pa.types.is_large_list_view(t):
        return pa.large_list(t.value_field.with_type(_unview(t.value_type)))
    if pa.types.is_string_view(t):
        return pa.large_string()
    if pa.types.is_binary_view(t):
        return pa.large_binary()
    return with_children(t, _unview)


def plain(table: pa.Table, schema: pa.Schema, where: str) -> pa.Table:
    """``table`` (read from ``where``) as ``schema``, its :func:`unviewed`. List views are
    rebuilt as lists: pyarrow 26's cast of one holding a null made an invalid array (offsets
    one short), found here."""
    columns = []
    for column, field in zip(table.columns, schema, strict=True):
        if column.type != field.type:
            column = pa.chunked_array([_plain_array(c, field.type, where, field.name)
                                       for c in column.chunks], field.type)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


def _plain_array(array: pa.Array, to: pa.DataType, where: str, name: str) -> pa.Array:
    """``array`` as ``to`` (its :func:`_unview`), containers rebuilt around their children:
    pyarrow's cast of a list view, or of a list or map holding one, makes an invalid array."""
    t = array.type
    if t == to:
        return array
    mask = array.is_null() if array.null_count else None
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        values = pc.list_flatten(array)  # in the rows' order, whatever the views' offsets
        lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
        offsets = np.zeros(len(array) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return _listed(to, offsets, _plain_array(values, to.value_type, where, name), mask)
    if pa.types.is_list(t) or pa.types.is_large_list(t):  # offsets into the whole child
        return _listed(to, array.offsets.to_numpy(),
                       _plain_array(array.values, to.value_type, where, name), mask)
    if pa.types.is_fixed_size_list(t):
        size = t.list_size
        values = array.values.slice(array.offset * size, len(array) * size)
        return pa.FixedSizeListArray.from_arrays(
            _plain_array(values, to.value_type, where, name), type=to, mask=mask)
    if pa.types.is_map(t):
        return pa.MapArray.from_arrays(  # (offsets of their own: a slice's say its offset)
            pa.array(array.offsets.to_numpy()), _plain_array(array.keys, to.key_type, where,
                                                              name),
            _plain_array(array.items, to.item_type, where, name), type=to, mask=mask)
    if pa.types.is_struct(t):
        return pa.StructArray.from_arrays(
            [_plain_array(array.field(i), to.field(i).type, where, name)
             for i in range(t.num_fields)], fields=list(to), mask=mask)
    out = array.cast(to)  # string and binary views, dictionaries of them
    try:
        out.validate()
    except pa.ArrowInvalid as exc:  # a cast pyarrow gets wrong
        raise DataError(
            f"{where}: column {name!r} ({t}) could not be read as {to} ({exc}); leave it out "
            "with columns=[...], or write it without views") from exc
    return out


def _listed(to: pa.DataType, offsets: np.ndarray, values: pa.Array,
            mask: pa.Array | None) -> pa.Array:
    """A list (or large list) array of type ``to`` from its offsets and values."""
    large = pa.types.is_large_list(to)
    make = pa.LargeListArray if large else pa.ListArray
    return make.from_arrays(pa.array(offsets, pa.int64() if large else pa.int32()), values,
                            type=to, mask=mask)
