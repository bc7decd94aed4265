"""Loader state: a small JSON cursor into the deterministic plan, and the checks on restoring it.

The plan is a pure function of (dataset, settings, epoch), so the state need not hold any data:
the epoch and how many batches each rank has yielded in it fix every row already delivered. In
DDP the ranks step in lockstep, so one rank's state describes the whole job's progress.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from ._discover import Discovery
from ._errors import StateMismatchError
from ._signed import unsigned

FORMAT = "pqloader.DataLoader"
# The plan's version: a state is a cursor into a plan, so a plan that cuts windows differently
# makes old cursors point at other rows. 2: a worker's first windows ramp up (64, 128, ...
# row groups), which changed the order of datasets with windows of more than 64 row groups.
# 3: each shuffle draws from a generator of its own (``_seeds.py``), which changed every
# shuffled order; an unshuffled epoch's plan is as it was: its states of version 2 resume.
VERSION = 3
_UNSHUFFLED_SINCE = 2


# Settings a resume may change (the rest of the epoch is dealt out anew) and must keep.
ELASTIC = ("batch_size", "world_size", "num_workers", "shuffle_window_rows")
FIXED = ("shuffle", "seed", "drop_last")


@dataclass(frozen=True)
class Cursor:
    """``batches`` batches of ``epoch`` already yielded by every rank.

    ``origin``: when this epoch's plan is what an earlier plan (other settings) left, that plan's
    settings and cursor, recursively: ``{"settings", "batches", "resumed_from", "recut",
    "own" | "shares"}`` (``recut``: the old plan's whole windows are cut to this plan's window
    size; ``own``: each rank dealt out its own rows left; ``shares``: its share of every
    rank's, cut to its windows after; each absent in states saved before pqloader did so,
    which resume as they were planned then).
    """

    epoch: int
    batches: int
    settings: Mapping[str, Any]
    origin: Mapping[str, Any] | None = None


def fingerprint(discovery: Discovery) -> dict[str, Any]:
    """What identifies a dataset's content: file names (relative), sizes, row groups, schema,
    filter.

    Names are taken relative to the files' common folder, so a dataset moved or mounted
    elsewhere still matches. Built from the index, so it needs no footer.
    """
    paths = [unsigned(f.path) for f in discovery.files]  # URLs signed again are the same files
    root = os.path.commonpath([os.path.dirname(p) for p in paths])
    digest = hashlib.sha256()
    for path, entry in zip(paths, discovery.files, strict=True):
        digest.update(json.dumps([os.path.relpath(path, root), entry.size_bytes]).encode())
    for array in (discovery.file_index, discovery.row_group, discovery.num_rows):
        digest.update(array.astype("<i8").tobytes())
    digest.update(str(discovery.schema).encode())
    if discovery.filter is not None:  # two filters may keep as many rows, not the same ones
        digest.update(f"filter {discovery.filter.key}".encode())
    return {"files": len(paths), "rows": int(discovery.num_rows.sum()),
            "digest": digest.hexdigest()[:32]}


def make_state(cursor: Cursor, dataset: Mapping[str, Any]) -> dict[str, Any]:
    """The state as plain JSON types (no pickle anywhere)."""
    return {"format": FORMAT, "version": VERSION, "epoch": cursor.epoch,
            "batches": cursor.batches, "dataset": dict(dataset),
            "settings": dict(cursor.settings),
            "resumed_from": None if cursor.origin is None else dict(cursor.origin)}


def read_state(state: Mapping[str, Any], dataset: Mapping[str, Any],
               settings: Mapping[str, Any]) -> Cursor:
    """Check a saved state against this loader and return its cursor, or say what differs.

    Settings in :data:`ELASTIC` may differ (the caller deals the rest of the epoch out anew);
    the others must match. The batch count is checked by the caller against the saved plan.
    """
    if not isinstance(state, Mapping) or state.get("format") != FORMAT:
        raise StateMismatchError(
            f"not a pqloader.DataLoader state (format {state.get('format')!r})"
            if isinstance(state, Mapping) else f"a state must be a dict, got {type(state)}"
        )
    saved_settings = state.get("settings")
    unshuffled = isinstance(saved_settings, Mapping) and saved_settings.get("shuffle") is False
    version = state.get("version")
    if version != VERSION and not (unshuffled and isinstance(version, int)
                                   and _UNSHUFFLED_SINCE <= version < VERSION):
        raise StateMismatchError(
            f"state version {state.get('version')!r}; this pqloader plans epochs as version "
            f"{VERSION}, so the state's cursor would point at other rows. Restore it with the "
            "pqloader that saved it, or start its epoch again (loader.set_epoch)"
        )
    saved = state.get("dataset")
    if not isinstance(saved, Mapping):
        raise StateMismatchError(f"the state's dataset {saved!r:.80} is not a dict")
    if saved != dict(dataset):
        raise StateMismatchError(
            f"the state is from another dataset ({saved.get('files')} files, "
            f"{saved.get('rows')} rows, digest {saved.get('digest')}); this one has "
            f"{dataset['files']} files, {dataset['rows']} rows, digest {dataset['digest']}: "
            "files, sizes, row groups, schema or filter differ (columns= and filter= count: "
            "open the dataset as the run that saved the state did)"
        )
    if not isinstance(saved_settings, Mapping) or set(saved_settings) != set(settings):
        raise StateMismatchError(f"the state's settings {saved_settings!r} are incomplete")
    differ = [
        f"{k}={saved_settings[k]!r} in the state, {settings[k]!r} here"
        for k in FIXED if saved_settings[k] != settings[k]
    ]
    if differ:
        raise StateMismatchError(
            "the state was saved with other settings: " + "; ".join(differ)
            + f". Only {', '.join(ELASTIC)} may change on a resume; build the loader with the "
            "saved values of the others"
        )
    epoch, batches = state.get("epoch"), state.get("batches")
    if not (_count(epoch) and _count(batches)):
        raise StateMismatchError(f"state cursor epoch={epoch!r}, batches={batches!r} is invalid")
    _check_elastic(saved_settings, "settings")
    origin = state.get("resumed_from")
    _check_origin(origin, saved_settings)
    return Cursor(epoch, batches, dict(saved_settings), origin)


def _count(value: Any, least: int = 0) -> TypeGuard[int]:
    return type(value) is int and value >= least  # not a bool, not a float


def _check_elastic(settings: Mapping[str, Any], where: str) -> None:
    """The settings a resume rebuilds a plan from, in range: a tampered or damaged state must
    be refused by name, not divide by zero deep in the plan."""
    least = {"batch_size": 1, "world_size": 1, "num_workers": 0, "shuffle_window_rows": 0}
    for name, low in least.items():
        if not _count(settings.get(name), low):
            raise StateMismatchError(
                f"the state's {where}.{name}={settings.get(name)!r} is invalid (an int >= "
                f"{low}); the state is damaged")


# Resumes under other settings within one epoch, each on the last: a real chain is a few long.
MAX_CHAIN = 100


def _check_origin(origin: Any, top: Mapping[str, Any], depth: int = 0) -> None:
    """``resumed_from``: None, or the earlier plan's settings and cursor, recursively. Each
    level keeps the settings no resume may change (a damaged seed there lost rows)."""
    where = "resumed_from" + ".resumed_from" * depth
    if origin is None:
        return
    if not isinstance(origin, Mapping):
        raise StateMismatchError(f"the state's {where} {origin!r:.80} is not a dict")
    if depth >= MAX_CHAIN:
        raise StateMismatchError(f"the state's resumed_from chain is over {MAX_CHAIN} resumes "
                                 "deep; the state is damaged")
    settings = origin.get("settings")
    if not isinstance(settings, Mapping) or set(settings) != set(top):
        raise StateMismatchError(f"the state's {where}.settings {settings!r:.80} are incomplete")
    for name in FIXED:
        if settings[name] != top[name]:
            raise StateMismatchError(
                f"the state's {where}.settings.{name}={settings[name]!r} differs from its "
                f"settings.{name}={top[name]!r}, which no resume changes; the state is damaged")
    _check_elastic(settings, f"{where}.settings")
    if not _count(origin.get("batches")):
        raise StateMismatchError(
            f"the state's {where}.batches={origin.get('batches')!r} is invalid")
    _check_origin(origin.get("resumed_from"), top, depth + 1)


PER_RANK = ("num_workers", "shuffle_window_rows")  # settings the ranks may each have their own


def check_own(state: Mapping[str, Any], cursor: Cursor, current: Mapping[str, Any],
              rank: int, *, complete: bool) -> None:
    """Refuse a state of ranks unlike each other (``PER_RANK``) anywhere but an exact resume
    of the rank that saved it: any other rebuilds every old rank's plan from this one's
    settings, and rows of the ranks that differed repeat and go missing (found in review).
    A state that does not know whether they were alike (saved before every rank had compared
    with rank 0, or by another rank) is refused where the resume rebuilds the old plans (other
    settings or world size). ``complete``: the state is at its epoch's end (nothing to deal)."""
    alike = state.get("ranks_alike")
    if alike is True or cursor.batches == 0 or complete:
        return
    saved = cursor.settings
    exact = dict(saved) == dict(current)
    own = ", ".join(f"{k}={saved[k]!r}" for k in PER_RANK)
    if alike is None:
        if exact or not state.get("ranks_compared"):  # nothing could tell: trusted
            return
        raise StateMismatchError(
            f"this state, saved by rank {state.get('rank')} of {saved['world_size']} ranks "
            f"({own} there), does not know whether every rank had rank 0's num_workers and "
            "shuffle_window_rows (only rank 0's state knows, once every rank has compared with "
            "it, within seconds of the first pass), so it cannot deal the rows left to other "
            "settings or another world size; resume with its settings, or from a later state "
            "of rank 0")
    if state.get("rank") == rank and exact:
        return
    raise StateMismatchError(
        f"this state was saved by rank {state.get('rank')} of {saved['world_size']} ranks "
        f"whose num_workers or shuffle_window_rows differed ({own} there): it restores that "
        "rank alone, with its settings; restore each rank's own state, or give every rank "
        "the same num_workers and shuffle_window_rows to resume with other settings or "
        "another world size")
