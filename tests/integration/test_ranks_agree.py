"""Ranks that plan differently are told so, in a real gloo group: a rank given other files, its
own seed or LOCAL_RANK repeated and lost rows silently (or yielded unequal batch counts: DDP
hangs at the epoch's end)."""

from __future__ import annotations

import json
import os
import pickle
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing

import pqloader

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _train_loader(files: list[str], kw: dict[str, Any]) -> pqloader.DataLoader:
    return pqloader.DataLoader(pqloader.ParquetDataset(files), **kw)


TRAIN_BUILT_AT = f"{Path(__file__).name}:{_train_loader.__code__.co_firstlineno + 1}"


def _torch_iterable(files: list[str], kw: dict[str, Any]) -> Any:
    return pqloader.ParquetDataset(files).to_torch(**kw)


TORCH_BUILT_AT = f"{Path(__file__).name}:{_torch_iterable.__code__.co_firstlineno + 1}"


def _rank(rank: int, port: int, case: str, source: str, out: str) -> None:
    if case == "seed per rank, check off":
        os.environ["PQLOADER_CHECK_RANKS"] = "0"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    files = sorted(str(f) for f in Path(source).glob("*.parquet"))
    kw: dict[str, Any] = {"batch_size": 16, "shuffle": True, "seed": 7, "num_workers": 0}
    base = case.replace("to_torch, ", "")
    if base.startswith("another file") and rank == 1:
        files = files[:-1]  # listed while the writer was still adding the last
    elif case == "another order" and rank == 1:
        files = files[::-1]  # a list built from a set
    elif base.startswith("seed per rank"):
        kw["seed"] = 7 + rank
    elif case == "another batch size" and rank == 1:
        kw["batch_size"] = 32
    elif case == "LOCAL_RANK" and rank == 1:
        kw.update(rank=0, world_size=WORLD)  # a second node's first process
    if case == "a stale rank 0 from an earlier run" and rank == 0:
        from torch.distributed.distributed_c10d import _get_default_store

        stale = {"time": time.time() - 3600, "token": "old", "terms": {"seed": 1}}
        _get_default_store().set(f"pqloader/agree/{WORLD}//{TRAIN_BUILT_AT}/0",
                                 json.dumps(stale))
    dist.barrier()
    rows, told = 0, ""
    try:
        if case == "agree, rank 0 peeks and reads alone" and rank == 0:
            alone = pqloader.DataLoader(pqloader.ParquetDataset(files), rank=0, world_size=1,
                                        **kw)
            rows += sum(len(b["id"]) for b in alone)  # no check: not over the group's ranks
        if case == "agree, rank 0 peeks at a loader of its own first" and rank == 0:
            own = pqloader.DataLoader(pqloader.ParquetDataset(files[:1]), batch_size=4)
            next(iter(own))  # built elsewhere: the train loaders are still matched
        if case.endswith("workers"):  # ranks of one num_workers, or each its own
            kw["num_workers"] = 1 + rank * (case == "unlike workers")
            loader = _train_loader(files, kw)
            for k, batch in enumerate(loader):
                rows += len(batch["id"])
                time.sleep(0.1)  # rank 1 compares with rank 0 meanwhile
                if k == 9:
                    break
            dist.barrier()
            Path(f"{out}.state{rank}").write_text(json.dumps(loader.state_dict()))
            raise pqloader.InvalidArgumentError("")
        if case == "to_torch, rank 0 builds none":
            if rank == 1:
                import warnings

                from pqloader import _torch as torch_module
                torch_module.FIRST_WAIT_S = 2.0  # type: ignore[misc]
                kw.pop("num_workers")
                it = _torch_iterable(files, kw)
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    began = time.monotonic()
                    len(it)  # a progress bar's: no wait (it stalled 30 s, found in review)
                    took = time.monotonic() - began
                    it.set_epoch(0)
                    rows += sum(len(b["id"]) for b in it)
                told = f"len() took {took:.1f} s; " + " ".join(str(w.message) for w in seen)
            raise pqloader.InvalidArgumentError(told)
        if case.startswith("to_torch"):  # torch's DataLoader over ds.to_torch()
            workers = int(case[-1])
            kw.pop("num_workers")
            if "rank 0 late" in case and rank == 0:
                time.sleep(1.0)  # its logging set up first, say
            it = _torch_iterable(files, kw)
            for epoch in range(3):
                it.set_epoch(epoch)
                for batch in torch.utils.data.DataLoader(it, batch_size=None,
                                                         num_workers=workers):
                    rows += len(batch["id"])
                    time.sleep(0.005)
            raise AssertionError("not told")
        loader = _train_loader(files, kw)
        pickle.dumps(loader)  # a loader under a group stays picklable
        if case.startswith("agree") and rank == 0:
            next(iter(loader))  # a look at one batch before training
        if case == "a stale rank 0 from an earlier run" and rank == 0:
            time.sleep(1)  # rank 1 sees only the stale value for a while
        for epoch in range(3):
            loader.set_epoch(epoch)
            for batch in loader:
                rows += len(batch["id"])
                time.sleep(0.005)  # a training step
    except pqloader.InvalidArgumentError as exc:
        told = str(exc)
    Path(f"{out}.{rank}").write_text(json.dumps({"rows": rows, "told": told}))
    dist.barrier()  # rank 0 holds the store: a rank told first must not take it away
    dist.destroy_process_group()


def _run(case: str, source: Path, out: Path) -> list[dict[str, Any]]:
    context = torch.multiprocessing.spawn(_rank, args=(_free_port(), case, str(source),
                                                       str(out)),
                                          nprocs=WORLD, join=False)
    deadline = time.monotonic() + 120
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for p in context.processes:
                p.kill()
            pytest.fail(f"{case}: the ranks hung")
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize(("case", "differs"), [
    ("another file", "rank 1 has 3 files of 750 rows, rank 0 4 files of 1,000 rows"),
    ("another order", "with digest"),
    ("seed per rank", "rank 1 has seed=8, rank 0 seed=7"),
    ("another batch size", "rank 1 has batch_size=32, rank 0 batch_size=16")])
def test_ranks_that_plan_differently_are_told(make_dataset: Any, tmp_path: Path, case: str,
                                               differs: str) -> None:
    source = make_dataset(1000, rows_per_file=250, row_group_size=50)
    first, second = _run(case, source, tmp_path / "out")
    told = f"rank 1 plans the loader built at {TRAIN_BUILT_AT} differently from rank 0"
    assert told in second["told"], second
    assert differs in second["told"]
    assert "a rank (so far) plans differently from rank 0; one was told: " + told \
        in first["told"], first
    assert differs in first["told"]
    assert first["rows"] < 3 * 500 and second["rows"] < 3 * 500  # within the first epoch


@pytest.mark.parametrize("workers", [0, 1])
def test_to_torch_ranks_that_plan_differently_are_told(make_dataset: Any, tmp_path: Path,
                                                       workers: int) -> None:
    """Rank 1 listed 3 of 4 files: it ran 8 batches an epoch against rank 0's 10, silently,
    and rank 0 died in its next collective. Now told by the next set_epoch at the latest
    (iterated in the process, at a batch once rank 0 has published)."""
    source = make_dataset(1000, rows_per_file=250, row_group_size=50)
    first, second = _run(f"to_torch, another file, {workers}", source, tmp_path / "out")
    told = f"rank 1 plans the loader built at {TORCH_BUILT_AT} differently from rank 0"
    assert told in second["told"], second
    assert "rank 1 has 3 files of 750 rows, rank 0 4 files of 1,000 rows" in second["told"]
    assert second["rows"] <= 375, second  # the first epoch at most
    assert first["told"] == "" or told in first["told"], first


def test_to_torch_ranks_are_told_before_their_first_epoch_when_rank_0_is_late(
        make_dataset: Any, tmp_path: Path) -> None:
    """Rank 0 built its loader a second after rank 1 reached set_epoch(0): rank 1 looked
    once, found nothing, and under torch's workers looked again only at the next set_epoch:
    a single-pass run (LLM pretraining) with seed=base + rank repeated and lost rows, never
    told (found in review). Rank 1's first look now waits for rank 0's plan."""
    source = make_dataset(1000, rows_per_file=250, row_group_size=50)
    first, second = _run("to_torch, seed per rank, rank 0 late, 2", source, tmp_path / "out")
    told = f"rank 1 plans the loader built at {TORCH_BUILT_AT} differently from rank 0"
    assert told in second["told"] and "rank 1 has seed=8, rank 0 seed=7" in second["told"]
    assert second["rows"] == 0, second  # told at set_epoch(0), before any row
    assert first["told"] == "" or told in first["told"], first


def test_to_torch_rank_0_that_builds_no_loader_is_waited_for_a_while(
        make_dataset: Any, tmp_path: Path) -> None:
    source = make_dataset(1000, rows_per_file=250, row_group_size=50)
    _, second = _run("to_torch, rank 0 builds none", source, tmp_path / "out")
    assert second["rows"] == 500, second  # its epoch, unchecked, after the warning
    took, said = second["told"].split("; ", 1)
    assert float(took.split()[2]) < 1.5, second  # not the 2 s set_epoch waits
    assert said.startswith("rank 1: rank 0 has not published its plan of the loader "
                           f"built at {TORCH_BUILT_AT} within 2 s"), second


def test_a_rank_given_local_rank_is_told(make_dataset: Any, tmp_path: Path) -> None:
    source = make_dataset(1000, rows_per_file=250, row_group_size=50)
    first, second = _run("LOCAL_RANK", source, tmp_path / "out")
    assert "rank 1 of the process group but its loader (built at" in second["told"]
    assert "was given rank=0 of world_size=2" in second["told"]
    assert second["rows"] == 0 and first["told"] == ""


@pytest.mark.parametrize("case", ["agree, rank 0 peeks and reads alone",
                                  "agree, rank 0 peeks at a loader of its own first",
                                  "a stale rank 0 from an earlier run",
                                  "seed per rank, check off"])
def test_ranks_that_agree_or_turn_the_check_off_are_not_told(make_dataset: Any, tmp_path: Path,
                                                             case: str) -> None:
    """Rank 0 reads a loader of its own (rank=0, world_size=1) and peeks at a batch, or peeks at
    a loader over the group's ranks that it alone builds (it shifted the pairing of the train
    loaders, then told apart by the order they were built in); or a value rank 0 left in the
    store before a restart (torchrun keeps its store) must be waited past."""
    source = make_dataset(1000, rows_per_file=250, row_group_size=50)
    results = _run(case, source, tmp_path / "out")
    assert [r["told"] for r in results] == ["", ""]
    alone = 1000 if case == "agree, rank 0 peeks and reads alone" else 0
    assert [r["rows"] for r in results] == [alone + 3 * 500, 3 * 500]


@pytest.mark.parametrize("case", ["unlike workers", "alike workers"])
def test_a_state_of_ranks_with_their_own_num_workers_restores_its_rank_alone(
        make_dataset: Any, tmp_path: Path, case: str) -> None:
    """Rank 0 with 1 worker, rank 1 with 2 (num_workers=os.cpu_count() on unlike nodes): a
    resume from rank 0's state on 3 ranks rebuilt rank 1's plan with 1 worker, and 120 rows
    came twice, 120 never, silently. The state now says the ranks differed."""
    source = make_dataset(1000, rows_per_file=250, row_group_size=50)
    _run(case, source, tmp_path / "out")
    state = json.loads((tmp_path / "out.state0").read_text())
    files = sorted(str(f) for f in Path(source).glob("*.parquet"))

    def resume(rank: int, world_size: int, workers: int) -> int:
        loader = pqloader.DataLoader(pqloader.ParquetDataset(files), batch_size=16,
                                     shuffle=True, seed=7, num_workers=workers, rank=rank,
                                     world_size=world_size)
        loader.load_state_dict(state)
        return sum(len(b["id"]) for b in loader)

    assert state["ranks_alike"] is (case == "alike workers")
    assert resume(0, 2, 1) == 500 - 160  # the rank that saved it, exactly
    if case == "alike workers":
        assert resume(1, 3, 2) > 0  # elastic: every old rank was rank 0's like
        return
    for rank, world_size, workers in ((0, 3, 1), (1, 2, 2), (0, 2, 2)):
        with pytest.raises(pqloader.StateMismatchError, match="restores that rank alone"):
            resume(rank, world_size, workers)
