"""Cache folders of older entry layouts (``v1/`` beside ``v2/``): found and sized for
``pqloader cache``, and never mistaken for a user's own folder of the same name."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ._cache_files import TEMPORARY, is_entry_folder, is_entry_name


def old_layouts(directory: Path, current: str) -> dict[str, int]:
    """The layout folders in ``directory`` other than ``current``, each with the bytes it holds."""
    out: dict[str, int] = {}
    if not directory.is_dir():
        return out
    for sub in os.scandir(directory):
        if sub.name != current and _is_layout(sub.name) and sub.is_dir(follow_symlinks=False) \
                and _holds_entries_only(Path(sub.path)):
            out[sub.name] = tree_bytes(Path(sub.path))
    return dict(sorted(out.items()))


def _is_layout(name: str) -> bool:
    return len(name) > 1 and name[0] == "v" and name[1:].isdigit()



def _holds_entries_only(root: Path) -> bool:
    """True when ``root`` holds nothing but what a cache layout writes (``ab/<sha256>.pqc``,
    temporaries, the lock): a ``v1/`` of the user's own files beside the cache is not one, and
    ``clear`` must never delete it."""
    for sub in os.scandir(root):
        if sub.name == ".lock" and sub.is_file(follow_symlinks=False):
            continue
        if not is_entry_folder(sub):
            return False
        for entry in os.scandir(sub.path):  # (a user's abstract.pqc or .tmp-notes passed
            # for entries, and clear deleted the folder: found in review)
            if not (entry.is_file(follow_symlinks=False) and (
                    TEMPORARY.fullmatch(entry.name) or is_entry_name(sub.name, entry.name))):
                return False
    return True


def tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total
