"""The types CSV and JSON Lines leave to pyarrow's guess: set with ``--column-type``, and
checked where a guess would write something other than the file's text.

(Leading zeros in a CSV column guessed integer are found where the text is, ``_convert._zeros``.)
Each check returns what is wrong, naming the file, column and row and the fix, or ``None``;
``pqloader write`` (``_convert.py``) refuses the source with it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_EXACT = 2**53  # float64 holds every integer below this, and only some above
_ID_RANGE = 2**64  # past 2**53 and up to here: 64-bit ids and hashes, the values at risk
_DECIMAL = re.compile(r"decimal(?:128)?\(\s*(\d+)\s*,\s*(\d+)\s*\)")


def column_type(text: str) -> tuple[str, pa.DataType]:
    """``--column-type NAME=TYPE``: a column and a pyarrow type name (int64, uint64, string...),
    or ``list<TYPE>`` of one (JSON Lines)."""
    name, sep, alias = text.rpartition("=")
    try:
        if not sep or not name:
            raise ValueError("expected NAME=TYPE")
        return name, _type(alias.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r}: {exc}; TYPE is a pyarrow type name such as int64, uint64, float64, "
            "string, bool, date32 or timestamp[ms], decimal128(P,S), or list<TYPE>") from None


def _type(alias: str) -> pa.DataType:
    for prefix, make in (("list<", pa.list_), ("large_list<", pa.large_list)):
        if alias.startswith(prefix) and alias.endswith(">"):
            return make(_type(alias[len(prefix):-1].strip()))
    if decimal := _DECIMAL.fullmatch(alias):  # pyarrow has no alias for them
        return pa.decimal128(int(decimal[1]), int(decimal[2]))
    return pa.type_for_alias(alias)


def guess_problem(schema: pa.Schema, typed: dict[str, pa.DataType], source: str) -> str | None:
    """A guess that writes something other than the text: a null type (the column was empty
    in every row guessed from), binary (text that is not UTF-8)."""
    for field in schema:
        if field.name in typed:
            continue
        if pa.types.is_null(field.type):
            return (f"{source}: column {field.name!r} is empty in every row its type was "
                    f"guessed from; pass --column-type {field.name}=TYPE (float64, string...)")
        inner, depth = field.type, 0
        while pa.types.is_list(inner) or pa.types.is_large_list(inner):
            inner, depth = inner.value_type, depth + 1
        if depth and pa.types.is_null(inner):  # later values fail: "changed from null to ..."
            spelled = "list<" * depth + "TYPE" + ">" * depth
            return (f"{source}: column {field.name!r} holds lists empty in every row its type "
                    f"was guessed from; pass --column-type {field.name}={spelled} (TYPE: "
                    "int64, float64, string...)")
        if _null_inside(field.type):
            return (f"{source}: column {field.name!r} holds objects with a field empty in "
                    "every row its type was guessed from; pqloader write cannot set the type "
                    "of values inside objects: write this file with pqloader.write_dataset "
                    "and a pyarrow schema")
        if pa.types.is_binary(field.type):
            return (f"{source}: column {field.name!r} holds text that is not UTF-8; pass "
                    "--encoding with the file's encoding (latin-1, cp1252...), or "
                    f"--column-type {field.name}=binary to keep its raw bytes")
    return None


def _null_inside(t: pa.DataType) -> bool:
    """A null type anywhere inside ``t`` (a struct's field, a list's values)."""
    return pa.types.is_null(t) or any(_null_inside(t.field(i).type)
                                      for i in range(t.num_fields))


def rounding_problem(batch: pa.RecordBatch, typed: dict[str, pa.DataType], first_row: int,
                     source: str, fmt: str) -> str | None:
    """Whole numbers from 2**53 to 2**64 in a column guessed float64, which rounds them: 64-bit
    ids and hashes (a CSV id of 18446744073709551615 became 1.8446744073709552e+19). The text
    is gone by then, so a real number there (1.2e17) is named too; beyond 2**64 (1.989e30),
    values are taken for real numbers."""
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        if name in typed:
            continue
        for values, rows in _floats(column, np.arange(len(column))):
            with np.errstate(invalid="ignore"):
                size = np.abs(values)
                bad = (size >= _EXACT) & (size <= _ID_RANGE) & (values == np.floor(values))
            if not bad.any():
                continue
            row = first_row + int(rows[np.argmax(bad)]) + 1
            nested = not pa.types.is_float64(column.type)  # inside lists or objects
            found = (f"{source}: column {name!r} "
                     f"{'holds numbers' if nested else 'was'} guessed float64, and its row "
                     f"{row:,} (from 1, after any header) holds {float(values[bad][0])!r}, a "
                     "whole number past 2**53, where float64 holds only some: ")
            if nested:
                return found + ("pqloader write cannot set the type of values inside lists "
                                "or objects; write this file with pqloader.write_dataset and "
                                "a pyarrow schema")
            text = ", or string" if fmt == "csv" else ""  # a JSON number cannot be a string
            if float(values[bad][0]) < 0:  # uint64 cannot hold it; int64 from -2**63
                return found + (f"if the column holds integers, pass --column-type {name}="
                                f"int64 (or decimal128(38,0) past -2**63{text}); if it holds "
                                f"real numbers, --column-type {name}=float64")
            return found + (f"if the column holds integers (ids, hashes), pass --column-type "
                            f"{name}=uint64 (or int64{text}; decimal128(38,0) past 2**64); if "
                            f"it holds real numbers, --column-type {name}=float64")
    return None


def _floats(array: pa.Array, rows: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The float64 values in ``array``, in lists and structs too, each with its row."""
    t = array.type
    if pa.types.is_float64(t):
        yield array.to_numpy(zero_copy_only=False), rows
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False)
        yield from _floats(array.flatten(), rows[parents])
    elif pa.types.is_struct(t):
        for child in array.flatten():
            yield from _floats(child, rows)
