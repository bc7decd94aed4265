"""A remote file of which only some byte ranges are fetched, as pyarrow reads files."""

from __future__ import annotations

import io
from typing import Any

from ._cache import Buffer
from ._ranges import Range


class RangeFile(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only some ranges are known; what a read
    asks for beyond them is fetched (rarely: padding that some writers' readers expect, a
    gap pyarrow's pre-buffering joined across)."""

    def __init__(self, size: int, chunks: dict[Range, Buffer], fetch: Any) -> None:
        super().__init__()
        self._size = size
        self._chunks = sorted(chunks.items())
        self._fetch = fetch
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = base + pos
        return self._pos

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def read(self, n: int | None = -1) -> Buffer:
        pos = self._pos
        n = self._size - pos if n is None or n < 0 else min(n, self._size - pos)
        self._pos = pos + n
        end = pos + n
        parts: list[Buffer] = []
        at = pos
        for (off, length), data in self._chunks:  # sorted; pyarrow may read several at once
            if off + length <= at:
                continue
            if at >= end:
                break
            if off > at:  # a gap between known ranges (pyarrow joins reads across up to 8
                parts.append(self._fetch(at, min(off, end) - at))  # KiB): it alone is
                at = min(off, end)  # fetched, not the whole read again (found by fuzzing)
                if at >= end:
                    break
            parts.append(memoryview(data)[at - off:min(end, off + length) - off])
            at = min(end, off + length)
        if at < end:
            parts.append(self._fetch(at, end - at))
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def readall(self) -> Buffer:  # type: ignore[override]
        return self.read(-1)
