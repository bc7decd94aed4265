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
from typing import Any

from ._discover import Discovery
from ._errors import StateMismatchError

FORMAT = "pqloader.DataLoader"
VERSION = 1


@dataclass(frozen=True)
class Cursor:
    """``batches`` batches of ``epoch`` already yielded by every rank."""

    epoch: int
    batches: int


def fingerprint(discovery: Discovery) -> dict[str, Any]:
    """What identifies a dataset's content: file names (relative), sizes, row groups, schema.

    Names are taken relative to the files' common folder, so a dataset moved or mounted
    elsewhere still matches.
    """
    paths = [f.path for f in discovery.files]
    root = os.path.commonpath([os.path.dirname(p) for p in paths])
    digest = hashlib.sha256()
    for entry in discovery.files:
        md = entry.metadata
        rows = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
        digest.update(json.dumps([os.path.relpath(entry.path, root), entry.size_bytes, rows])
                      .encode())
    digest.update(str(discovery.schema).encode())
    return {"files": len(paths), "rows": int(discovery.num_rows.sum()),
            "digest": digest.hexdigest()[:32]}


def make_state(cursor: Cursor, dataset: Mapping[str, Any],
               settings: Mapping[str, Any]) -> dict[str, Any]:
    """The state as plain JSON types (no pickle anywhere)."""
    return {"format": FORMAT, "version": VERSION, "epoch": cursor.epoch,
            "batches": cursor.batches, "dataset": dict(dataset), "settings": dict(settings)}


def read_state(state: Mapping[str, Any], dataset: Mapping[str, Any],
               settings: Mapping[str, Any], num_batches: int) -> Cursor:
    """Check a saved state against this loader and return its cursor, or say what differs."""
    if not isinstance(state, Mapping) or state.get("format") != FORMAT:
        raise StateMismatchError(
            f"not a pqloader.DataLoader state (format {state.get('format')!r})"
            if isinstance(state, Mapping) else f"a state must be a dict, got {type(state)}"
        )
    if state.get("version") != VERSION:
        raise StateMismatchError(
            f"state version {state.get('version')!r}; this pqloader reads version {VERSION}"
        )
    saved = state.get("dataset", {})
    if saved != dict(dataset):
        raise StateMismatchError(
            f"the state is from another dataset ({saved.get('files')} files, "
            f"{saved.get('rows')} rows, digest {saved.get('digest')}); this one has "
            f"{dataset['files']} files, {dataset['rows']} rows, digest {dataset['digest']}: "
            "files, sizes, row groups or schema differ"
        )
    differ = [
        f"{k}={state.get('settings', {}).get(k)!r} in the state, {v!r} here"
        for k, v in settings.items() if state.get("settings", {}).get(k) != v
    ]
    if differ:
        raise StateMismatchError(
            "the state was saved with other settings: " + "; ".join(differ)
            + ". Build the loader with the saved settings to resume this epoch"
        )
    epoch, batches = state.get("epoch"), state.get("batches")
    if not (isinstance(epoch, int) and isinstance(batches, int)
            and epoch >= 0 and 0 <= batches <= num_batches):
        raise StateMismatchError(
            f"state cursor epoch={epoch!r}, batches={batches!r} is out of range "
            f"(0..{num_batches} batches per epoch)"
        )
    return Cursor(epoch, batches)
