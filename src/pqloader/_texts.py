"""Text that pyarrow's guess of a CSV or JSON Lines column changes without a word, found by
reading the guessed columns again as text, alongside: leading zeros and hexadecimal in a
column guessed integer ("01234" became 1234, "0x00FF00" 65280), and times that name a zone
offset in a JSON column guessed timestamp (pyarrow's JSON reader turns them into UTC and drops
the zone, and leaves times without one as they are: two clocks in one column).

The first block is checked before any row is written; each later one as its rows go by.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

# CSV integers pyarrow 26 reads from text whose digits a number drops: "01234", "0x1F"
_PADDED = r"^\s*[+-]?0[0-9xX]"
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
    """Refuse text of ``block`` (rows from ``first_row``) that an integer would change."""
    for name in guessed:
        found = pc.match_substring_regex(block.column(name), _PADDED)
        if pc.any(found).as_py():
            row = pc.index(found, True).as_py()
            value = block.column(name)[row].as_py()
            lost = "is read as a hexadecimal number" if "x" in value.lower() else \
                "drops its leading zero"
            raise TextProblem(
                f"{source}: column {name!r} was guessed {schema.field(name).type}, and its "
                f"row {first_row + row + 1:,} (from 1, after any header) is {value!r}: an "
                f"integer {lost}. Pass --column-type {name}=string to keep the text (zip "
                f"codes, phone numbers, ids, colours), or --column-type {name}=int64 if it is "
                "a number")


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
