"""`pqloader cache ls|du|clear`: a local cache of remote data, seen and emptied from a shell."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ._cache import Cache
from ._convert import CommandFailure
from ._inspect import human_bytes


def cmd_cache(args: argparse.Namespace) -> int:
    """``pqloader cache ls|du|clear DIR``: bytes per remote file, in all, or cleared."""
    if not Path(args.dir).is_dir():  # a mistyped folder: say so, make nothing
        what = f"{args.dir} is not a folder" if Path(args.dir).exists() else \
            f"no cache folder at {args.dir}"
        if args.action == "clear" and not Path(args.dir).exists():
            print(json.dumps({"dir": str(args.dir), "freed_bytes": 0}) if args.json else
                  f"{what}: nothing to clear")
            return 0
        raise CommandFailure(f"{what}; pass the folder given as pqloader.Cache(directory)")
    cache = Cache(args.dir)
    if args.action == "clear":  # (--json printed text: found by a CLI fuzzer)
        freed = cache.clear()
        print(json.dumps({"dir": str(args.dir), "freed_bytes": freed}) if args.json else
              f"freed {human_bytes(freed)} in {args.dir}")
        return 0
    old = cache.old_layouts()
    note = (f"plus {human_bytes(sum(old.values()))} in entries of other pqloader versions' "
            f"layouts ({', '.join(old)}), which this version never reads: `pqloader cache "
            f"clear {args.dir}` deletes them") if old else ""
    if args.action == "du":
        seen = cache.survey()  # damaged entries' bytes too, as eviction counts them
        if args.json:
            print(json.dumps({"dir": str(args.dir), "entries": len(seen.entries),
                              "bytes": seen.bytes, "damaged_bytes": seen.damaged_bytes,
                              "unreadable_bytes": seen.unreadable_bytes, "old_layouts": old}))
        else:
            print(f"{human_bytes(seen.bytes)} in {len(seen.entries):,} entries ({args.dir})")
            if seen.damaged_bytes:
                print(f"of which {human_bytes(seen.damaged_bytes)} in damaged entries, which "
                      f"loaders delete as they meet them, and `pqloader cache clear "
                      f"{args.dir}` too")
            if seen.unreadable_bytes:
                print(f"of which {human_bytes(seen.unreadable_bytes)} in entries this user "
                      "cannot read (another user's?)")
            if note:
                print(note)
        return 0
    entries = cache.entries()
    if args.json:
        print(json.dumps([{"url": e.url, "version": e.version, "offset": e.offset,
                           "length": e.length, "bytes": e.size_bytes, "last_used": e.last_used}
                          for e in entries]))
        return 0
    by_url: dict[str, list[Any]] = {}
    for e in entries:
        by_url.setdefault(e.url, []).append(e)
    print(f"{'bytes':>10}  {'ranges':>6}  url")
    for url, group in sorted(by_url.items()):
        print(f"{human_bytes(sum(e.size_bytes for e in group)):>10}  {len(group):>6}  {url}")
    if note:
        print(note)
    return 0
