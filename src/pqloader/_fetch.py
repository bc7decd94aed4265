"""Remote byte ranges read through the cache: each one from its entry when there, else fetched
(coalesced, in parallel, retried: :class:`~pqloader._fs.Store`) and written to it."""

from __future__ import annotations

from collections.abc import Sequence

from ._cache import Buffer, Cache, CorruptCacheEntry
from ._fs import Store
from ._ranges import Range
from ._versions import cacheable


def cached_ranges(store: Store, cache: Cache | None, path: str, version: str | None,
                  ranges: Sequence[Range]) -> dict[Range, Buffer]:
    """The bytes of ``ranges`` of ``path``: from the cache when there, else fetched (and
    cached). A damaged entry is counted, deleted and fetched again.

    A fetched range is written to its entry piece by piece and handed back memory-mapped from
    it, so it is never joined in memory (nor held twice); if it is gone again already (evicted
    by another process, or a cache smaller than it), the pieces are joined instead.
    """
    if cache is None or not cacheable(version):  # no version (no ETag, no mtime), or
        # one that the next rewrite may keep: never cached, never stale
        return dict(store.read_ranges(path, ranges, version))
    url = store.url(path)
    found: dict[Range, Buffer] = {}
    missing = []
    for r in ranges:
        try:
            data = cache.get(url, version, *r)
        except CorruptCacheEntry:
            store.stats.add(cache_corrupt=1)
            data = None
        if data is None:
            missing.append(r)
        else:
            found[r] = data
    store.stats.add(cache_hits=len(found), cache_misses=len(missing))
    for r, pieces in store.read_pieces(path, missing, version).items():
        written: Buffer | None = None
        if cache.put(url, version, *r, pieces):
            try:
                written = cache.get(url, version, *r)
            except CorruptCacheEntry:
                written = None
        found[r] = written if written is not None else b"".join(pieces)
    return found
