"""A remote row group's column chunks: their byte ranges, and those found without a request
(in the tail fetched with the file's footer, or in the cached entry of the whole row group)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ._cache import Buffer, Cache, CorruptCacheEntry
from ._footers import tail_range
from ._fs import ObjectInfo, Store
from ._ranges import Range, coalesce
from ._versions import cacheable

NO_SPLIT = 1 << 62  # coalesce's part size when ranges are merged only, never cut
# pyarrow's pre-buffering reads a row group's chunks joined across gaps up to this (its
# CacheOptions' hole_size_limit): spans joined across less left it reading a gap no span held
PREBUFFER_HOLE = 8 << 10


def span_hole(hole_bytes: int) -> int:
    """The gap that a row group's projected chunks are joined across into one span."""
    return max(hole_bytes, PREBUFFER_HOLE)


def chunk_range(col: Any, file_size: int) -> Range:
    """A column chunk's bytes: from its dictionary page (if any) over its compressed size."""
    start = col.data_page_offset
    if col.has_dictionary_page and 0 < col.dictionary_page_offset < start:
        start = col.dictionary_page_offset
    return start, max(0, min(col.total_compressed_size, file_size - start))


def within_tail(tail: pa.Buffer | None, store: Store, cache: Cache | None, obj: ObjectInfo,
                spans: list[Range]) -> dict[Range, Buffer] | None:
    """``spans`` sliced out of the tail fetched for the file's footer, when they lie in it (a
    small file's row groups; a large file's last, when small) and it is at hand: ``tail``,
    fetched lately, or in the cache. None otherwise."""
    start, n = tail_range(obj.size)
    if any(a < start or a + length > start + n for a, length in spans):
        return None
    if tail is None:
        if cache is None or not cacheable(obj.version):
            return None
        try:
            tail = cache.get(store.url(obj.path), obj.version, start, n)
        except CorruptCacheEntry:
            store.stats.add(cache_corrupt=1)
            return None
        if tail is None:
            return None
        store.stats.add(cache_hits=1)
    return {(a, length): tail.slice(a - start, length) for a, length in spans}


def within_whole(store: Store, cache: Cache | None, obj: ObjectInfo, rg: Any,
                 spans: list[Range]) -> dict[Range, Buffer] | None:
    """A narrower projection's spans, sliced out of the row group's entry for every column
    when a read of the whole row group cached it (the usual first read: no ``columns=``); None
    when that entry is absent or damaged, or is what ``spans`` asks for anyway.

    Cache entries are keyed by their exact range, so without this a second job reading some of
    the columns fetched again what the cache already held.
    """
    if cache is None or not cacheable(obj.version):
        return None
    every = coalesce([chunk_range(rg.column(i), obj.size) for i in range(rg.num_columns)],
                     span_hole(store.retry.hole_bytes), part=NO_SPLIT)
    if every == spans:
        return None
    url = store.url(obj.path)
    wholes: dict[Range, pa.Buffer] = {}
    out: dict[Range, Buffer] = {}
    for start, length in spans:
        whole = next(((w0, wn) for w0, wn in every
                      if w0 <= start and start + length <= w0 + wn), None)
        if whole is None:
            return None
        if whole not in wholes:
            try:
                data = cache.get(url, obj.version, *whole)
            except CorruptCacheEntry:
                store.stats.add(cache_corrupt=1)
                return None
            if data is None:
                return None
            wholes[whole] = data
        out[(start, length)] = wholes[whole].slice(start - whole[0], length)
    store.stats.add(cache_hits=len(wholes))
    return out
