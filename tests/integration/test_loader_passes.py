"""Passes over one loader: again after a resume with other settings, across epochs with
persistent workers, after a timeout: each pass is the epoch it should be."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pqloader

ROWS = 1000


def _ids(batches: Any) -> list[int]:
    return [int(i) for b in batches for i in b["id"]]


def _resumed(make_dataset: Any, **kwargs: Any) -> pqloader.DataLoader:
    """A loader of ``kwargs`` resumed from a state saved by another setting, 30 batches in."""
    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    first = pqloader.DataLoader(ds, batch_size=10, shuffle=True, seed=3, num_workers=0)
    it = iter(first)
    for _ in range(30):
        next(it)
    state = first.state_dict()
    loader = pqloader.DataLoader(ds, **{"batch_size": 10, **kwargs}, shuffle=True, seed=3)
    loader.load_state_dict(state)
    return loader


@pytest.mark.parametrize("kwargs", [{"num_workers": 2}, {"num_workers": 3},
                                    {"num_workers": 2, "batch_size": 20}])
def test_the_pass_after_an_elastic_resume_is_a_whole_epoch(make_dataset: Any,
                                                           kwargs: dict[str, Any]) -> None:
    loader = _resumed(make_dataset, **kwargs)
    rest = _ids(loader)
    assert len(rest) == len(set(rest)) == ROWS - 300  # the rows the state had not delivered
    for _ in range(2):  # the same epoch again, no set_epoch: all of it, as torch would
        again = _ids(loader)
        assert sorted(again) == list(range(ROWS))
        assert len(loader) == -(-ROWS // loader.batch_size)


def test_persistent_processes_forget_a_resumed_plan_with_the_epoch(make_dataset: Any) -> None:
    loader = _resumed(make_dataset, num_workers=2, worker_type="process",
                      persistent_workers=True)
    try:
        counts = [len(list(loader))]
        for epoch in (1, 0):
            loader.set_epoch(epoch)
            counts.append(len(list(loader)))
        assert counts == [70, 100, 100]  # not 70 again: the workers hold the whole plan
    finally:
        del loader
        gc.collect()


class _SlowWhile:
    """A transform, run in worker processes, that takes ``seconds`` a batch while a marker
    file exists."""

    def __init__(self, marker: Path, seconds: float) -> None:
        self.marker = marker
        self.seconds = seconds

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        if self.marker.exists():
            time.sleep(self.seconds)
        return batch


def test_persistent_processes_start_again_after_a_timeout(make_dataset: Any,
                                                          tmp_path: Path) -> None:
    marker = tmp_path / "stall"
    marker.touch()
    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=2, worker_type="process",
                                 persistent_workers=True, timeout=2,
                                 transform=_SlowWhile(marker, 30))
    try:
        with pytest.raises(pqloader.LoaderTimeoutError):
            list(loader)
        marker.unlink()
        loader.set_epoch(1)
        assert sorted(_ids(loader)) == list(range(ROWS))
    finally:
        del loader
        gc.collect()


def _with_pid(batch: dict[str, Any]) -> dict[str, Any]:
    return {**batch, "pid": os.getpid()}


def _broken_off(make_dataset: Any) -> tuple[pqloader.DataLoader, set[int]]:
    """A loader of persistent worker processes whose first pass was broken off after 4
    batches, and the worker pids that made them."""
    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=2, worker_type="process",
                                 persistent_workers=True, transform=_with_pid)
    pids = set()
    for k, batch in enumerate(loader):
        pids.add(batch["pid"])
        if k == 3:
            break
    return loader, pids


def test_persistent_processes_outlive_a_pass_broken_off(make_dataset: Any) -> None:
    """A break (or a dropped iterator) shut them down: each later epoch started new ones."""
    loader, pids = _broken_off(make_dataset)
    try:
        loader.set_epoch(1)
        batches = list(loader)
        assert sorted(_ids(batches)) == list(range(ROWS))
        assert {b["pid"] for b in batches} <= pids and os.getpid() not in pids
    finally:
        del loader
        gc.collect()


def test_a_worker_dead_after_a_pass_broken_off_is_told_once(make_dataset: Any) -> None:
    """The next pass's reset (it drains the pass broken off) failed outside the handling
    that forgets dead workers: every later epoch failed ("exited unexpectedly")."""
    loader, pids = _broken_off(make_dataset)
    try:
        try:
            os.kill(min(pids), signal.SIGKILL)
            time.sleep(1.0)
        except RuntimeError:  # torch's SIGCHLD handler may tell it here already
            pass
        loader.set_epoch(1)
        with pytest.raises(RuntimeError, match=r"exited unexpectedly|killed"):
            list(loader)
        for epoch in (2, 3):
            loader.set_epoch(epoch)
            assert sorted(_ids(loader)) == list(range(ROWS))
    finally:
        del loader
        gc.collect()


def test_a_pass_overtaken_under_persistent_processes_says_so(make_dataset: Any) -> None:
    """torch's persistent iterator is one: a second pass reset it under the first, and the
    two passes shared one epoch's batches, silently."""
    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=2, worker_type="process",
                                 persistent_workers=True)
    try:
        older = iter(loader)
        first = next(older)
        assert sorted(_ids(loader)) == list(range(ROWS))  # the newer pass: a whole epoch
        with pytest.raises(pqloader.InvalidArgumentError, match="overtaken by a newer one"):
            next(older)
        assert sorted(_ids(loader)) == list(range(ROWS)) and len(first["id"]) == 50
    finally:
        del loader
        gc.collect()


def test_a_pass_from_another_thread_overtakes_one_waiting_in_next(make_dataset: Any,
                                                                  tmp_path: Path) -> None:
    """A pass started in another thread while the first waited inside torch's next() reset
    the iterator under it: torch's KeyError, an empty epoch, or a hang."""
    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    flag = tmp_path / "slow"
    loader = pqloader.DataLoader(ds, batch_size=10, num_workers=2, worker_type="process",
                                 persistent_workers=True, transform=_SlowWhile(flag, 0.5))
    told: dict[str, Any] = {}

    def older() -> None:
        got = 0
        try:
            for _ in loader:
                got += 1
                if got == 3:
                    flag.write_text("")  # the next batches are slow: it waits inside next()
        except pqloader.InvalidArgumentError as exc:
            told["older"] = str(exc)

    try:
        first = threading.Thread(target=older)
        first.start()
        time.sleep(1.0)
        flag.unlink(missing_ok=True)
        assert sorted(_ids(loader)) == list(range(ROWS))  # the newer pass: a whole epoch
        first.join(60)
        assert "overtaken by a newer one" in told.get("older", ""), told
    finally:
        flag.unlink(missing_ok=True)
        loader = None  # its persistent workers stop
        gc.collect()


def test_a_hung_transform_times_out_under_auto(make_dataset: Any) -> None:
    """With num_workers="auto" the caller made batches no thread had taken, and a transform
    hung there hung it, timeout= or not: with a timeout, threads make every batch."""
    makers: list[str] = []

    def noted(batch: dict[str, Any]) -> dict[str, Any]:
        makers.append(threading.current_thread().name)  # a hang here: the timeout's to see
        return batch

    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    loader = pqloader.DataLoader(ds, batch_size=10, num_workers="auto", timeout=5.0,
                                 transform=noted)
    assert sorted(_ids(loader)) == list(range(ROWS))
    assert threading.main_thread().name not in makers  # it made 17-35 of the 100 batches
    release = threading.Event()

    def hangs(batch: dict[str, Any]) -> dict[str, Any]:
        if 500 in batch["id"].tolist():
            release.wait(60)
        return batch

    loader = pqloader.DataLoader(ds, batch_size=10, num_workers="auto", timeout=1.0,
                                 transform=hangs)
    try:
        with pytest.raises(pqloader.LoaderTimeoutError, match=r"timeout=1\.0"):
            for _ in loader:
                pass
    finally:
        release.set()


@pytest.mark.parametrize("persistent", [False, True])
def test_worker_init_fn_of_persistent_threads_runs_once_per_index(
        make_dataset: Any, persistent: bool) -> None:
    calls: list[int] = []
    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=2, worker_init_fn=calls.append,
                                 persistent_workers=persistent)
    for epoch in range(3):
        loader.set_epoch(epoch)
        assert sorted(_ids(loader)) == list(range(ROWS))
    assert sorted(calls) == ([0, 1] if persistent else [0, 0, 0, 1, 1, 1])


def test_a_failed_worker_init_fn_runs_again_next_pass(make_dataset: Any) -> None:
    calls: list[int] = []

    def init(index: int) -> None:
        calls.append(index)
        if len(calls) == 1:
            raise ValueError("first init fails")

    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=1, worker_init_fn=init,
                                 persistent_workers=True)
    with pytest.raises(ValueError, match="first init fails"):
        list(loader)
    assert sorted(_ids(loader)) == list(range(ROWS))
    assert calls == [0, 0]


def test_a_random_transform_still_gets_its_generator(make_dataset: Any) -> None:
    seen: list[type] = []

    def flip(batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        seen.append(type(rng))
        return batch

    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    list(pqloader.DataLoader(ds, batch_size=500, num_workers=0, transform=flip))
    assert seen == [np.random.Generator] * 2


def test_an_older_pass_resumed_by_hand_does_not_move_the_cursor(make_dataset: Any) -> None:
    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    loader = pqloader.DataLoader(ds, batch_size=10, num_workers=0)
    old = iter(loader)
    for _ in range(3):
        next(old)
    loader.set_epoch(1)
    next(old)  # epoch 0's iterator, still held
    assert (loader.state_dict()["epoch"], loader.state_dict()["batches"]) == (1, 0)
    new = iter(loader)
    next(new)
    next(old)
    assert loader.state_dict()["batches"] == 1


@pytest.mark.parametrize(("epoch", "start", "match"), [
    (0, -1, "start must be"), (-1, 0, "epoch must be"), (1.5, 0, "epoch must be"),
    (0, 101, "past the epoch's 100 batches")])
def test_to_torch_set_epoch_checks_its_cursor(make_dataset: Any, epoch: Any, start: Any,
                                              match: str) -> None:
    it = pqloader.ParquetDataset(make_dataset(ROWS)).to_torch(batch_size=10, shuffle=True)
    with pytest.raises(pqloader.InvalidArgumentError, match=match):
        it.set_epoch(epoch, start)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_to_torch_resumes_under_the_num_workers_its_start_counts(make_dataset: Any) -> None:
    """``start`` counts batches of a plan dealt to torch's workers: under another count, 154
    of 1,000 rows came twice and 154 never, silently. Now said, and checked."""
    import torch

    ds = pqloader.ParquetDataset(make_dataset(1000))

    def ids(workers: int, start: int, said: int | None, count: int | None = None) -> list[int]:
        it = ds.to_torch(batch_size=64, shuffle=True, seed=5, shuffle_window_rows=250)
        it.set_epoch(0, start, num_workers=said)
        out: list[int] = []
        for k, batch in enumerate(torch.utils.data.DataLoader(it, batch_size=None,
                                                              num_workers=workers)):
            if k == count:
                break
            out += batch["id"].tolist()
        return out

    for workers in (0, 2):
        head = ids(workers, 0, None, count=5)
        assert sorted(head + ids(workers, 5, workers)) == list(range(1000))
    with pytest.raises(pqloader.InvalidArgumentError, match="needs num_workers="):
        ids(2, 5, None)
    with pytest.raises(pqloader.InvalidArgumentError, match=r"counts batches of 2 torch"):
        ids(0, 5, 2)
    with pytest.raises(Exception, match=r"counts batches of 2 torch worker.*has 3"):
        ids(3, 5, 2)


@pytest.mark.parametrize(("keyword", "match"), [
    ("num_workers", "torch's DataLoader takes it"), ("shufle", "unexpected keyword 'shufle'"),
    ("world", "unexpected keyword 'world'")])
def test_to_torch_names_a_keyword_it_does_not_take(make_dataset: Any, keyword: str,
                                                   match: str) -> None:
    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    with pytest.raises(pqloader.InvalidArgumentError, match=match):
        ds.to_torch(batch_size=10, **{keyword: 2})


@pytest.mark.parametrize("mode", [{"num_workers": 0}, {"num_workers": 2},
                                  {"num_workers": 2, "worker_type": "process"}])
def test_an_epoch_resumed_on_fewer_ranks_counts_its_own_batches(make_dataset: Any,
                                                                mode: dict[str, Any]) -> None:
    """3 ranks' 1,000 rows (334 a rank, padded) resumed on one rank: its epoch deals what
    they left, 1,000 rows in 10 batches of 100; len() said 10 while the old padding made 11
    come, and worker processes refused the state saved at that epoch's end."""
    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    kw: dict[str, Any] = {"batch_size": 100, "shuffle": True, "seed": 1}
    state = pqloader.DataLoader(ds, rank=0, world_size=3, **kw).state_dict()
    resumed = pqloader.DataLoader(ds, rank=0, world_size=1, **kw, **mode)
    resumed.load_state_dict(state)
    ids = _ids(resumed)
    assert sorted(ids) == list(range(ROWS))  # each once: world_size 1 repeats none
    assert len(resumed) == -(-ROWS // 100)
    end = resumed.state_dict()
    again = pqloader.DataLoader(ds, rank=0, world_size=1, **kw, **mode)
    again.load_state_dict(end)
    again.set_epoch(end["epoch"])  # the rest of the state's epoch: none
    assert _ids(again) == []
    again.load_state_dict(end)  # iterated as it is: the next epoch
    assert sorted(_ids(again)) == list(range(ROWS)) and again.epoch == end["epoch"] + 1


def test_a_chain_of_elastic_resumes_plans_each_level_once(make_dataset: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rank's remainder needs every old rank's plan: remade per rank, a chain of two
    resumes over 8 ranks planned 8**3 epochs (seconds over 16 ranks, minutes over 64)."""
    from pqloader import _torch

    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    kw: dict[str, Any] = {"batch_size": 5, "shuffle": True, "seed": 2}
    state = pqloader.DataLoader(ds, rank=0, world_size=8, **kw).state_dict()
    for world in (7, 6):  # elastic twice: each state names the one before
        loaders = [pqloader.DataLoader(ds, rank=r, world_size=world, **kw) for r in range(world)]
        for loader in loaders:
            loader.load_state_dict(state)
            it = iter(loader)
            next(it)
            it.close()  # type: ignore[attr-defined]
        state = loaders[0].state_dict()
    calls = _count_calls(monkeypatch, _torch, "plan_epoch")
    last = pqloader.DataLoader(ds, rank=0, world_size=6, **kw)
    last.load_state_dict(state)
    next(iter(last))
    assert calls[0] <= 8 + 1  # the first level's 8 ranks, once (and a fresh plan at most)


def _count_calls(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """Counts the calls of ``module.name`` from now on, in the list's one item."""
    calls = [0]
    real = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_len_after_an_elastic_resume_deals_the_remainder_once(
        make_dataset: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """len(loader) after an elastic resume dealt what the old ranks left at each call: a
    trainer calling it every step stalled 0.25-3.8 s a call on 20M rows (found in review)."""
    from pqloader import _torch

    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    kw: dict[str, Any] = {"batch_size": 5, "shuffle": True, "seed": 2}
    old = pqloader.DataLoader(ds, rank=0, world_size=3, **kw)
    it = iter(old)
    next(it)
    it.close()  # type: ignore[attr-defined]
    state = old.state_dict()
    calls = _count_calls(monkeypatch, _torch, "remaining")
    resumed = pqloader.DataLoader(ds, rank=0, world_size=2, **kw)
    resumed.load_state_dict(state)
    lengths = {len(resumed) for _ in range(5)}
    assert calls == [1] and lengths == {len(resumed)}
    ids = [int(i) for batch in resumed for i in batch["id"]]
    assert len(ids) == len(set(ids)) and calls[0] <= 2  # the pass plans with its num_workers


@pytest.mark.parametrize("finished", [True, False])
def test_len_after_an_elastically_resumed_pass_is_the_next_passs(make_dataset: Any,
                                                                 finished: bool) -> None:
    """Once the resumed pass is over (or broken off), the next pass of the epoch plans it
    whole under the new settings: len() still said the resumed epoch's length, 68 against
    the 20 batches it then yielded (found by fuzzing configurations)."""
    ds = pqloader.ParquetDataset(make_dataset(1000, rows_per_file=400, row_group_size=50))
    old = pqloader.DataLoader(ds, batch_size=10, shuffle=True, seed=1, num_workers=0)
    it = iter(old)
    for _ in range(60):
        next(it)
    state = old.state_dict()
    it.close()  # type: ignore[attr-defined]
    new = pqloader.DataLoader(ds, batch_size=50, shuffle=True, seed=1, num_workers=0)
    new.load_state_dict(state)
    assert len(new) == 68  # 60 before the state, and the 8 the rest makes at 50
    resumed = iter(new)
    next(resumed)
    assert len(new) == 68  # while it runs
    if finished:
        assert sum(1 for _ in resumed) == 7
    else:
        resumed.close()  # type: ignore[attr-defined]
    assert len(new) == 20 == sum(1 for _ in new)


@pytest.mark.parametrize("kwargs", [{"num_workers": 0}, {"num_workers": 2},
                                    {"num_workers": "auto"},
                                    {"num_workers": 2, "worker_type": "process",
                                     "persistent_workers": True}])
def test_a_pass_after_an_epoch_ended_is_the_next_epoch(make_dataset: Any,
                                                        kwargs: dict[str, Any]) -> None:
    """torch's DataLoader(shuffle=True) shuffles anew at each pass; a loop without set_epoch
    repeated epoch 0's order and its transforms' draws at every pass (found in review)."""
    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    loader = pqloader.DataLoader(ds, batch_size=50, shuffle=True, seed=3, **kwargs)
    passes = [_ids(loader) for _ in range(3)]
    assert loader.epoch == 2
    for epoch, ids in enumerate(passes):
        assert sorted(ids) == list(range(ROWS))
        loader.set_epoch(epoch)  # what set_epoch gives: each pass the epoch it chose
        assert _ids(loader) == ids
    assert passes[0] != passes[1] != passes[2]
    assert _ids(loader) != passes[2] and loader.epoch == 3  # set_epoch chose one pass


def test_a_pass_left_early_starts_its_epoch_over_and_says_so(make_dataset: Any) -> None:
    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    loader = pqloader.DataLoader(ds, batch_size=50, shuffle=True, seed=3, num_workers=0)
    whole = _ids(loader)
    loader.set_epoch(0)
    first = next(iter(loader))  # a look at one batch: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _ids(loader) == whole and loader.epoch == 0
    for k, _ in enumerate(loader):  # steps per epoch: left after 5
        if k == 4:
            break
    with pytest.warns(UserWarning, match="this pass starts epoch 1 over, in the order of the "
                                         "pass left after 5 batches: call loader.set_epoch"):
        again = _ids(loader)
    assert loader.epoch == 1 and again[:50] != list(first["id"])
    # an older pass's iterator that ends after a newer pass began moves nothing
    old = iter(loader)
    next(old)
    newer = iter(loader)
    next(newer)
    list(old)
    assert loader.epoch == 2 and _ids(loader)[:50] != []  # epoch 2: newer never ended it


def test_a_state_at_its_epochs_end_goes_on_with_the_next_epoch(make_dataset: Any) -> None:
    """A state saved after the epoch's loop: iterated as it is, the next epoch (it gave 0
    batches while len() said 20, then repeated the epoch); after set_epoch of its epoch, that
    epoch's remainder: nothing (a checkpoint saved at an epoch's end, resumed by a loop that
    sets the checkpoint's epoch)."""
    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    saver = pqloader.DataLoader(ds, batch_size=50, shuffle=True, seed=3, num_workers=0)
    _ids(saver)
    state = saver.state_dict()
    for workers in (0, 2):  # its own settings, and others (the order is num_workers')
        loader = pqloader.DataLoader(ds, batch_size=50, shuffle=True, seed=3,
                                     num_workers=workers)
        loader.set_epoch(1)
        next_epoch = _ids(loader)
        loader.load_state_dict(state)
        assert len(loader) == 20 and _ids(loader) == next_epoch and loader.epoch == 1
        loader.load_state_dict(state)
        loader.set_epoch(0)
        assert _ids(loader) == [] and loader.epoch == 0
        loader.set_epoch(1)
        assert _ids(loader) == next_epoch


def test_a_pass_that_took_every_batch_ended_its_epoch(make_dataset: Any) -> None:
    """itertools.islice(loader, len(loader)) and zip() take the last batch without reaching
    StopIteration: the epoch repeated, warned of as left early, while a state saved then
    said it ended (and resumed with the next epoch; found in review)."""
    import itertools

    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    loader = pqloader.DataLoader(ds, batch_size=100, shuffle=True, seed=3, num_workers=2)
    other = pqloader.DataLoader(ds, batch_size=100, shuffle=True, seed=3, num_workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = _ids(itertools.islice(loader, len(loader)))
        assert loader.state_dict()["batches"] == len(loader) and loader.epoch == 0
        second = _ids(loader)
        assert loader.epoch == 1 and second != first
        for _ in range(2):
            for _a, _b in zip(loader, other, strict=False):
                pass
    assert loader.epoch == 3 and other.epoch == 1  # each pass of other ended its epoch


def test_over_ranks_the_epoch_moves_on_by_set_epoch_or_a_state_at_its_end(
        make_dataset: Any) -> None:
    """Ranks that made other numbers of passes (rank 0 alone fitting a normalizer over the
    loader first) planned other epochs, rows lost and repeated silently: over several ranks a
    pass repeats its epoch unless set_epoch (or a state at its end, which every rank loads)
    moves it on, warned of (found in review)."""
    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    kw: dict[str, Any] = {"batch_size": 50, "shuffle": True, "seed": 3, "num_workers": 0,
                          "rank": 0, "world_size": 2}
    loader = pqloader.DataLoader(ds, **kw)
    first = _ids(loader)
    with pytest.warns(UserWarning, match="this pass repeats epoch 0's order: over several "
                                         "ranks the epoch moves on only by set_epoch"):
        assert _ids(loader) == first and loader.epoch == 0
    state = loader.state_dict()
    loader.set_epoch(1)
    following = _ids(loader)
    assert following != first
    resumed = pqloader.DataLoader(ds, **kw)
    resumed.load_state_dict(state)
    assert len(resumed) == 10 and _ids(resumed) == following and resumed.epoch == 1


def test_len_before_a_pass_after_a_state_at_its_end_is_the_next_epochs(
        make_dataset: Any) -> None:
    """Loaded under another batch size, len() said the old epoch's resumed length (20) while
    the pass made the next epoch's 5 batches: schedulers sized from it (found in review)."""
    ds = pqloader.ParquetDataset(make_dataset(ROWS))
    saver = pqloader.DataLoader(ds, batch_size=50, shuffle=True, seed=3, num_workers=0)
    _ids(saver)
    loader = pqloader.DataLoader(ds, batch_size=200, shuffle=True, seed=3, num_workers=0)
    loader.load_state_dict(saver.state_dict())
    assert len(loader) == 5 == len(list(loader)) and loader.epoch == 1


def test_len_after_a_resumed_pass_took_its_last_batch_is_the_next_passs(
        make_dataset: Any) -> None:
    """Its iterator kept (islice, not exhausted), len() said the resumed epoch's length (12)
    while the next pass made the whole epoch (13; found by fuzzing)."""
    import itertools

    ds = pqloader.ParquetDataset(make_dataset(100, rows_per_file=40, row_group_size=10))
    saver = pqloader.DataLoader(ds, 10, shuffle=True, seed=1, num_workers=0)
    list(itertools.islice(saver, 3))
    state = saver.state_dict()
    loader = pqloader.DataLoader(ds, 4, shuffle=True, seed=1, num_workers=0, rank=0,
                                 world_size=2)
    loader.load_state_dict(state)
    it = iter(loader)
    taken = list(itertools.islice(it, len(loader) - 3))  # the resumed pass's every batch
    assert taken and len(loader) == 13
    with pytest.warns(UserWarning, match="this pass repeats epoch 0's order"):  # 2 ranks
        assert len(list(loader)) == 13


_FORKSERVER_SCRIPT = '''
import multiprocessing, os, sys
import pqloader

def torch_in_the_forkserver(worker_id):  # a forkserver's child: its parent is the forkserver
    with open(f"/proc/{os.getppid()}/maps") as maps:
        if "libtorch" not in maps.read():
            raise RuntimeError("the forkserver had not loaded torch: each worker imported it")

if __name__ == "__main__":
    multiprocessing.set_forkserver_preload(["__main__", "json"])  # the user's own
    ds = pqloader.ParquetDataset(sys.argv[1])
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=1, worker_type="process",
                                 multiprocessing_context="forkserver",
                                 worker_init_fn=torch_in_the_forkserver)
    print(sum(len(b["id"]) for b in loader))
    print(multiprocessing.forkserver._forkserver._preload_modules)
'''


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc/PID/maps")
def test_a_forkserver_preloads_torch_and_pqloader_for_the_workers(make_dataset: Any,
                                                                  tmp_path: Path) -> None:
    """Each worker a forkserver started imported torch and pqloader itself: 1.7-4 s each
    pass's start, against 0.03-0.12 s once the forkserver has them (Python 3.14's default)."""
    script = tmp_path / "forkserver_job.py"
    script.write_text(_FORKSERVER_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(make_dataset(200))],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows, modules = done.stdout.strip().splitlines()
    assert rows == "200"
    assert modules == "['__main__', 'json', 'torch', 'pqloader._processes']"
