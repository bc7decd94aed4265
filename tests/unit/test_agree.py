"""Whether the ranks planned alike, as a state says it and as a resume is checked against it.

The store is a stand-in here (the real one, under gloo, is in tests/integration/
test_ranks_agree.py): these tests need its interleavings, which real ranks give by chance.
"""

from __future__ import annotations

from typing import Any

import pytest

import pqloader
from pqloader import _agree
from pqloader._state import Cursor, check_own
from pqloader._world import World


class _Store:
    """The counters of a store; ``between`` runs once, right after the first read."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.between: Any = None

    def set(self, key: str, value: Any) -> None:
        self.values[key] = value

    def add(self, key: str, amount: int) -> int:
        self.values[key] = self.values.get(key, 0) + amount
        value = int(self.values[key])
        if amount == 0 and self.between is not None:
            between, self.between = self.between, None
            between()
        return value


def test_rank_0_never_takes_a_rank_that_compares_between_its_reads_for_alike(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 differs: it counts itself under "unlike", then "agree". Rank 0 read "unlike",
    then "agree": a rank counted between the two reads was taken for alike, and the state
    said ranks_alike=True for good (an elastic resume then lost rows; found in review)."""
    store = _Store()
    monkeypatch.setattr(_agree, "_group", lambda: (0, 2))
    monkeypatch.setattr(_agree, "_store", lambda: store)
    agreement = _agree.Agreement(World(rank=0, world_size=2), "test_agree.py:1")
    agreement.begin({"seed": 0}, {"num_workers": 1})
    assert agreement.compared
    watch = agreement._watch

    def rank_1_differs() -> None:
        store.add(f"{watch}/unlike", 1)
        store.add(f"{watch}/agree", 1)

    store.between = rank_1_differs
    assert agreement.alike() is not True
    assert agreement.alike() is False  # and, once rank 1 has counted itself, known


def test_a_store_that_fails_leaves_the_ranks_uncompared(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Its states then resume as states of no process group do, not refused as unknown."""
    class Broken(_Store):
        def set(self, key: str, value: Any) -> None:
            raise RuntimeError("the store is gone")

    monkeypatch.setattr(_agree, "_group", lambda: (0, 2))
    monkeypatch.setattr(_agree, "_store", Broken)
    agreement = _agree.Agreement(World(rank=0, world_size=2), "test_agree.py:3")
    agreement.begin({"seed": 0}, {"num_workers": 1})
    assert not agreement.compared and agreement.alike() is None


def test_without_a_process_group_nothing_is_compared() -> None:
    assert not _agree.Agreement(World(rank=0, world_size=2), "test_agree.py:2").compared


def _state(alike: bool | None, *, compared: bool | None, rank: int = 0) -> dict[str, Any]:
    state: dict[str, Any] = {"rank": rank, "ranks_alike": alike}
    if compared is not None:  # states saved before ranks_compared say nothing of it
        state["ranks_compared"] = compared
    return state


SAVED = {"world_size": 2, "num_workers": 1, "shuffle_window_rows": 300, "batch_size": 16}
ELASTIC = {**SAVED, "world_size": 3}


def _check(state: dict[str, Any], current: dict[str, Any], *, rank: int = 0,
           batches: int = 6, complete: bool = False) -> None:
    check_own(state, Cursor(0, batches, SAVED, None), current, rank, complete=complete)


def test_a_state_that_does_not_know_whether_ranks_were_alike_resumes_only_as_saved() -> None:
    """Saved before every rank had compared with rank 0 (a checkpoint in the first seconds),
    or by a rank but 0: an elastic resume rebuilt the old ranks' plans from its settings as
    if they were alike, and rows were lost (65 and 66 twice in review)."""
    unknown = _state(None, compared=True)
    with pytest.raises(pqloader.StateMismatchError, match="does not know whether every rank"):
        _check(unknown, ELASTIC)
    with pytest.raises(pqloader.StateMismatchError, match="does not know whether every rank"):
        _check(_state(None, compared=True, rank=1), ELASTIC, rank=1)
    for rank in (0, 1):  # under its own settings: each rank skips its own batches
        _check(unknown, SAVED, rank=rank)
    _check(_state(True, compared=True), ELASTIC)
    _check(_state(None, compared=False), ELASTIC)  # no process group: nothing could tell
    _check(_state(None, compared=None), ELASTIC)  # saved before pqloader said


def test_a_state_at_its_epochs_end_resumes_anywhere() -> None:
    """Nothing of the epoch is left to deal, so whether the ranks were alike does not matter;
    the next epoch is planned anew (found in review: a state of unlike ranks was refused)."""
    for alike in (False, None):
        _check(_state(alike, compared=True), ELASTIC, complete=True)
        _check(_state(alike, compared=True), ELASTIC, batches=0)
    with pytest.raises(pqloader.StateMismatchError, match="restores that rank alone"):
        _check(_state(False, compared=True), ELASTIC)
