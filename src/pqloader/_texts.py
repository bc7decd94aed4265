"""Text that pyarrow's guess of a CSV or JSON Lines column changes without a word, found by
reading the guessed columns again as text, alongside: leading zeros and hexadecimal in a
column guessed integer ("01234" became 1234, "0x00FF00" 65280), leading zeros and numbers
past float64's range in one guessed float ("+4420...", "0207..." lost the zero; "1e400"
became inf), and times that name a zone offset in a JSON column guessed timestamp
(pyarrow's JSON reader turns them into UTC and drops the zone, and leaves times without one
as they are: two clocks in one column).

The first block is checked before any row is written; each later one as its rows go by.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

# CSV integers pyarrow 26 reads from text whose digits a number drops: "01234", "0x1F"
_PADDED = r"^\s*[+-]?0[0-9xX]"
_PADDED_FLOAT = r"^\s*[+-]?0[0-9]"  # (a float column of phone numbers: "+4420...", "0207...")
# Text that may pass float64's largest, 1.8e308 (read as inf): an exponent of 100 or more, or
# 100 digits (below both, at most ~1e198); each such value is then read by Python, which
# rounds as pyarrow does (300 digits missed 250 of them and e99, found in review)
_HUGE = r"[eE]\+?0*[1-9][0-9]{2,}|[0-9]{100}"
_INF = {"inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"}
# a time of day that names its zone: "...T09:00:00Z", "... 09:00+02:00", "...T09-0500",
# "...T09+02" (a date alone, "2024-03-10", is none: its day is no offset, found in review)
_ZONED = (r"(?i)[t ][0-9]{2}(:[0-9]{2}(:[0-9]{2}([.,][0-9]+)?)?)?\s*"
          r"(z|[+-][0-9]{2}(:?[0-9]{2})?)\s*$")


class TextProblem(Exception):
    """What is wrong with a source's text, said for the command line."""


def alongside(batches: Iterator[pa.RecordBatch], text: Iterator[pa.RecordBatch],
              check: Callable[[pa.RecordBatch, int], None]) -> Iterator[pa.RecordBatch]:
    """``batches``, while ``check(text_block, first_row)`` looks at the text of the rows
    they hold (the same file read again, its guessed columns as text): the first block now."""
    checked = [0]  # rows of text checked

    def upto(rows: int) -> None:
        while checked[0] < rows and (block := next(text, None)) is not None:
            check(block, checked[0])
            checked[0] += block.num_rows

    upto(1)

    def gen() -> Iterator[pa.RecordBatch]:
        given = 0
        for batch in batches:
            given += batch.num_rows
            upto(given)
            yield batch

    return gen()


def padded(block: pa.RecordBatch, first_row: int, source: str, schema: pa.Schema,
           guessed: list[str]) -> None:
    """Refuse text of ``block`` (rows from ``first_row``) that the number its column was
    guessed would change: leading zeros (and hexadecimal, for integers), and floats past
    float64's range, read as inf (found by a round-trip fuzzer, with the leading zeros of a
    column guessed float64 for a phone number's "+")."""
    for name in guessed:
        column, kind = block.column(name), schema.field(name).type
        found = pc.match_substring_regex(
            column, _PADDED_FLOAT if pa.types.is_floating(kind) else _PADDED)
        if pc.any(found).as_py():
            row = pc.index(found, True).as_py()
            value = column[row].as_py()
            lost = "is read as a hexadecimal number" if "x" in value.lower() else \
                "drops its leading zero"
            number = "a float" if pa.types.is_floating(kind) else "an integer"
            raise TextProblem(
                f"{source}: column {name!r} was guessed {kind}, and its row "
                f"{first_row + row + 1:,} (from 1, after any header) is {value!r}: {number} "
                f"{lost}. Pass --column-type {name}=string to keep the text (zip codes, "
                f"phone numbers, ids, colours), or --column-type {name}="
                f"{'float64' if pa.types.is_floating(kind) else 'int64'} if it is a number")
        if pa.types.is_floating(kind):
            _in_range(column, first_row, source, name)


def _in_range(column: pa.Array, first_row: int, source: str, name: str) -> None:
    """Refuse a float written past float64's largest, which pyarrow reads as inf."""
    huge = pc.match_substring_regex(column, _HUGE)
    for row in pc.indices_nonzero(pc.fill_null(huge, False)).to_pylist():
        text = column[row].as_py()
        try:
            inf = math.isinf(float(text)) and text.strip().lower() not in _INF
        except ValueError:
            continue  # not a number pyarrow read (a null's spelling, say)
        if inf:
            raise TextProblem(
                f"{source}: column {name!r} was guessed a float, and its row "
                f"{first_row + row + 1:,} (from 1, after any header) is {text[:40]!r}, past "
                f"float64's largest (1.8e308): it would be written as inf. Pass --column-type "
                f"{name}=string to keep the text, or --column-type {name}=float64 to write "
                "inf")


class Zones:
    """Whether each JSON timestamp column without a zone names zone offsets in its text:
    decided by its first value (a guessed one then written as UTC, what the offsets were
    converted to), and every later value must agree. Top-level columns only: times in lists
    and objects are not looked at."""

    def __init__(self, source: str, names: list[str]) -> None:
        self._source = source
        self.zoned: dict[str, bool] = {}  # per column, once a value decided
        self._first: dict[str, tuple[int, str]] = {}
        self._names = names

    def check(self, block: pa.RecordBatch, first_row: int) -> None:
        for name in self._names:
            column = block.column(name)
            found = pc.match_substring_regex(column, _ZONED)
            valid = column.is_valid()
            if not pc.any(valid).as_py():
                continue
            if name not in self.zoned:
                row = pc.index(valid, True).as_py()
                self.zoned[name] = bool(found[row].as_py())
                self._first[name] = (first_row + row + 1, column[row].as_py())
            unlike = pc.and_(valid, pc.invert(found) if self.zoned[name] else found)
            if pc.any(unlike).as_py():
                row = pc.index(unlike, True).as_py()
                at, first = self._first[name]
                said = "with" if self.zoned[name] else "without"
                raise TextProblem(
                    f"{self._source}: column {name!r} is a timestamp; its row {at:,} "
                    f"(from 1) is {first!r}, {said} a zone offset, and row "
                    f"{first_row + row + 1:,} is {column[row].as_py()!r}: pyarrow reads times "
                    "with an offset as UTC and those without as they are, two clocks in one "
                    f"column. Give every value an offset (or none), or pass --column-type "
                    f"{name}=string to keep the text")

    def schema(self, schema: pa.Schema, guessed: list[str]) -> pa.Schema:
        """``schema``, its ``guessed`` zoned columns' timestamps in UTC (``schema`` itself
        where none is)."""
        if not any(self.zoned.get(n) for n in guessed):
            return schema
        return pa.schema([f.with_type(pa.timestamp(f.type.unit, "UTC"))
                          if f.name in guessed and self.zoned.get(f.name) else f
                          for f in schema], metadata=schema.metadata)
