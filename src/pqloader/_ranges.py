"""Byte ranges of a remote object: merged across small gaps, cut into parallel parts, and back."""

from __future__ import annotations

from collections.abc import Sequence

Range = tuple[int, int]  # (offset, length)


def coalesce(ranges: Sequence[Range], hole: int, part: int) -> list[Range]:
    """Sorted ranges merged across gaps up to ``hole`` bytes, then cut into ``part``-byte
    pieces, so that a large column chunk is fetched by several requests at once."""
    merged: list[list[int]] = []
    for off, n in sorted(ranges):
        if merged and off <= merged[-1][0] + merged[-1][1] + hole:
            end = max(merged[-1][0] + merged[-1][1], off + n)
            merged[-1][1] = end - merged[-1][0]
        else:
            merged.append([off, n])
    out: list[Range] = []
    for off, n in merged:
        pieces = max(1, -(-n // part))
        step = max(1, -(-n // pieces))  # an empty range needs no request
        out.extend((o, min(step, off + n - o)) for o in range(off, off + n, step))
    return out


def cut(fetched: dict[Range, bytes], want: Range) -> list[bytes]:
    """The pieces of ``fetched`` (ranges and their bytes) that make up ``want``, in order."""
    off, n = want
    parts = []
    for (p_off, p_n), data in sorted(fetched.items()):
        lo, hi = max(off, p_off), min(off + n, p_off + p_n)
        if lo < hi:
            parts.append(data if (lo, hi) == (p_off, p_off + p_n) else data[lo - p_off:hi - p_off])
    return parts or [b""]
