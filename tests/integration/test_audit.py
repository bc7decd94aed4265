"""The sample audit: records of what each rank delivered, and the coverage check."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import pqloader
from pqloader._audit import decode_rows, encode_rows
from pqloader._cli import main


@pytest.mark.parametrize("rows", [[], [5], list(range(10, 20)), [3, 1, 2, 9, 8, 100]])
def test_row_codec_round_trips(rows: list[int]) -> None:
    assert decode_rows(encode_rows(np.array(rows, dtype=np.int64))).tolist() == sorted(rows)


def test_contiguous_rows_cost_two_numbers() -> None:
    assert len(encode_rows(np.arange(100_000, 104_096))) < 40


@pytest.mark.parametrize("mode", [{"num_workers": 0}, {"num_workers": 2},
                                  {"num_workers": 2, "worker_type": "process"}])
def test_records_are_the_rows_delivered(make_dataset: Any, tmp_path: Path,
                                        mode: dict[str, Any]) -> None:
    ds = pqloader.ParquetDataset(make_dataset(1000), columns=["id"])  # id == row number
    loader = pqloader.DataLoader(ds, batch_size=64, shuffle=True, audit_dir=tmp_path / "a",
                                 **mode)
    delivered = [sorted(b["id"].tolist()) for b in loader]
    (record,) = (tmp_path / "a").glob("rank*.jsonl")
    lines = [json.loads(x) for x in record.read_text().splitlines()[1:]]
    assert [decode_rows(x["rows"]).tolist() for x in lines] == delivered
    (report,) = pqloader.audit(tmp_path / "a")
    assert report.exactly_once and report.delivered == 1000
    assert report.batches_per_rank == {0: len(loader)}


def test_ranks_together_are_exactly_once(make_dataset: Any, tmp_path: Path,
                                         capsys: Any) -> None:
    ds = pqloader.ParquetDataset(make_dataset(960))
    for rank in range(3):
        list(pqloader.DataLoader(ds, batch_size=32, shuffle=True, rank=rank, world_size=3,
                                 audit_dir=tmp_path))
    (report,) = pqloader.audit(tmp_path)
    assert report.exactly_once
    assert report.batches_per_rank == {0: 10, 1: 10, 2: 10}
    capsys.readouterr()
    assert main(["audit", str(tmp_path)]) == 0
    out = capsys.readouterr().out  # per worker too, as the README says
    assert "batches per rank: rank 0: 10, rank 1: 10, rank 2: 10" in out, out
    assert "batches per rank/worker: 0/0: 5, 0/1: 5, 1/0: 5, 1/1: 5, 2/0: 5, 2/1: 5" in out, out


def _resume_everywhere(ds: pqloader.ParquetDataset, state: dict[str, Any], *,
                       world_size: int, **options: Any) -> None:
    """Every rank of a new world resumes ``state`` and delivers the rest of its epoch."""
    for rank in range(world_size):
        loader = pqloader.DataLoader(ds, rank=rank, world_size=world_size, **options)
        loader.load_state_dict(state)
        list(loader)


def test_the_padding_that_evens_ranks_is_no_duplicate(make_dataset: Any, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """1,001 rows over 3 ranks of 334: 1 row comes twice so that every rank yields 11 batches,
    as documented; the audit failed every such run ("1 rows more than once", exit 1)."""
    ds = pqloader.ParquetDataset(make_dataset(1001))
    for rank in range(3):
        list(pqloader.DataLoader(ds, batch_size=32, shuffle=True, rank=rank, world_size=3,
                                 audit_dir=tmp_path))
    (report,) = pqloader.audit(tmp_path)
    assert (report.padding, report.duplicates, report.missing) == (1, 0, 0)
    assert report.exactly_once and report.delivered == 1002
    assert main(["audit", str(tmp_path)]) == 0
    assert "1 again: the padding that evens the ranks" in capsys.readouterr().out


def test_the_padding_of_an_epoch_resumed_in_another_world_is_no_duplicate(
        make_dataset: Any, tmp_path: Path) -> None:
    """997 rows over 4 ranks pads 3 (delivered before the state is saved); the 3 ranks that
    resume even the rows left again, 1 more. The audit failed such a run, as the loader
    documents it ("4 rows more than once")."""
    ds = pqloader.ParquetDataset(make_dataset(997))
    options: dict[str, Any] = {"shuffle": False, "num_workers": 2, "shuffle_window_rows": 100,
                               "audit_dir": tmp_path}
    old = [pqloader.DataLoader(ds, batch_size=50, rank=r, world_size=4, **options)
           for r in range(4)]
    for loader in old:
        for k, _ in enumerate(loader):
            if k == 3:  # 4 batches of 5: rank 3's padding among them
                break
    _resume_everywhere(ds, old[0].state_dict(), batch_size=7, world_size=3, **options)
    (report,) = pqloader.audit(tmp_path)
    assert (report.padding, report.duplicates, report.missing) == (4, 0, 0)
    assert report.exactly_once


def test_the_padding_of_each_resume_counts_a_world_size_come_back_to_again(
        make_dataset: Any, tmp_path: Path) -> None:
    """An epoch run in 2 ranks, resumed in 3, then in 2 again: each run evens its rows anew,
    1 + 2 + 1 = 4 rows twice, as the loader documents. The audit counted each world size
    once (1 + 2) and failed the run (found in review). Seed 2: an order in which rank 1 gives
    its padding row (a copy of rank 0's first) before the first stop, so each later run has
    rows to even too (with seeds 0, 1, 3-6 it comes later: 999 rows, none twice)."""
    ds = pqloader.ParquetDataset(make_dataset(999, rows_per_file=250, row_group_size=37))
    state: dict[str, Any] | None = None
    delivered = 0
    for world_size, batch_size, workers, stop in ((2, 10, 0, 21), (3, 9, 3, 21),
                                                  (2, 10, 0, None)):
        states = []
        for rank in range(world_size):
            loader = pqloader.DataLoader(ds, batch_size=batch_size, shuffle=True, seed=2,
                                         num_workers=workers, rank=rank, world_size=world_size,
                                         shuffle_window_rows=2000, audit_dir=tmp_path)
            if state is not None:
                loader.load_state_dict(state)
            for k, batch in enumerate(loader, 1):
                delivered += len(batch["id"])
                if k == stop:
                    break
            states.append(loader.state_dict())
        state = states[0]
    assert delivered == 999 + 4
    (report,) = pqloader.audit(tmp_path)
    assert (report.padding, report.duplicates, report.missing) == (4, 0, 0)
    assert report.exactly_once


@pytest.mark.parametrize("world_size", [1, 3])
def test_rows_drop_last_leaves_out_are_not_missing(make_dataset: Any, tmp_path: Path,
                                                   world_size: int,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """1,001 rows in batches of 32 with drop_last leave out 25 rows (one rank) or 41 (three
    ranks of 10 batches), as asked: the audit called them missing and failed (exit 1)."""
    ds = pqloader.ParquetDataset(make_dataset(1001))
    for rank in range(world_size):
        list(pqloader.DataLoader(ds, batch_size=32, shuffle=True, rank=rank,
                                 world_size=world_size, drop_last=True, audit_dir=tmp_path))
    (report,) = pqloader.audit(tmp_path)
    dropped = 1001 - world_size * (1001 // world_size // 32 * 32)
    assert (report.dropped, report.missing, report.duplicates) == (dropped, 0, 0)
    assert report.exactly_once and report.delivered == 1001 - dropped
    assert main(["audit", str(tmp_path)]) == 0
    assert f"every row exactly once, but the {dropped} that drop_last leaves out" \
        in capsys.readouterr().out


def test_a_rank_missing_beside_drop_last_is_still_missing(make_dataset: Any,
                                                          tmp_path: Path) -> None:
    ds = pqloader.ParquetDataset(make_dataset(1001))
    for rank in (0, 1):  # rank 2 never ran
        list(pqloader.DataLoader(ds, batch_size=32, shuffle=True, rank=rank, world_size=3,
                                 drop_last=True, audit_dir=tmp_path))
    (report,) = pqloader.audit(tmp_path)
    assert report.missing == 1001 - 640 and report.dropped == 0 and not report.exactly_once
    assert main(["audit", str(tmp_path)]) == 1


def test_a_real_duplicate_beside_padding_room_is_still_one(make_dataset: Any,
                                                            tmp_path: Path) -> None:
    """One rank's records twice (a rank restarted from scratch): more than padding explains."""
    ds = pqloader.ParquetDataset(make_dataset(1001))
    for rank in (0, 1, 2, 2):
        list(pqloader.DataLoader(ds, batch_size=32, shuffle=True, rank=rank, world_size=3,
                                 audit_dir=tmp_path))
    (report,) = pqloader.audit(tmp_path)
    assert report.duplicates > 1 and report.padding == 0 and not report.exactly_once


def test_a_crash_and_resume_shows_the_redelivered_batches(make_dataset: Any,
                                                          tmp_path: Path) -> None:
    ds = pqloader.ParquetDataset(make_dataset(1000), columns=["id"])
    kw: dict[str, Any] = {"batch_size": 50, "shuffle": True, "num_workers": 2,
                          "audit_dir": tmp_path}
    first = pqloader.DataLoader(ds, **kw)
    it = iter(first)
    for _ in range(6):
        next(it)
    checkpoint = first.state_dict()  # saved after 6 batches
    after = [sorted(next(it)["id"].tolist()) for _ in range(3)]  # delivered, then a crash
    del it
    second = pqloader.DataLoader(ds, **kw)
    second.load_state_dict(checkpoint)
    list(second)
    (report,) = pqloader.audit(tmp_path)
    assert report.missing == 0
    assert report.duplicates == sum(len(b) for b in after) == 150
    repeated = {r for ex in report.duplicate_examples for r in ex["rows"]}
    assert repeated <= {r for b in after for r in b}
    assert main(["audit", str(tmp_path)]) == 1


def test_an_unfinished_epoch_has_gaps(make_dataset: Any, tmp_path: Path, capsys: Any) -> None:
    ds = pqloader.ParquetDataset(make_dataset(500))
    it = iter(pqloader.DataLoader(ds, batch_size=100, audit_dir=tmp_path))
    next(it)
    del it
    assert main(["audit", str(tmp_path), "--json"]) == 1
    (report,) = json.loads(capsys.readouterr().out)
    assert (report["missing"], report["duplicates"], report["exactly_once"]) == (400, 0, False)


def test_no_records_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(pqloader.InvalidArgumentError, match="no audit records"):
        pqloader.audit(tmp_path)


def test_a_run_stopped_before_its_first_batch_fails_the_audit(make_dataset: Any,
                                                                tmp_path: Path,
                                                                capsys: Any) -> None:
    record = _one_epoch(make_dataset, tmp_path)
    header = record.read_text(encoding="utf-8").splitlines()[0]
    record.write_text(header + "\n", encoding="utf-8")  # killed after its header
    assert pqloader.audit(tmp_path) == []
    assert main(["audit", str(tmp_path)]) == 1
    assert "no batch was recorded" in capsys.readouterr().err


def test_records_of_two_datasets_of_one_size_are_not_merged(make_dataset: Any,
                                                            tmp_path: Path) -> None:
    for rank, files in ((0, 100), (1, 50)):  # rank 0 of one dataset, rank 1 of another
        ds = pqloader.ParquetDataset(make_dataset(200, rows_per_file=files))
        list(pqloader.DataLoader(ds, batch_size=50, num_workers=0, rank=rank, world_size=2,
                                 audit_dir=tmp_path))
    with pytest.raises(pqloader.InvalidArgumentError, match="records of another dataset"):
        pqloader.audit(tmp_path)


def _one_epoch(make_dataset: Any, directory: Path) -> Path:
    """Records of a complete epoch of 200 rows in 4 batches; the record file's path."""
    ds = pqloader.ParquetDataset(make_dataset(200), columns=["id"])
    list(pqloader.DataLoader(ds, batch_size=50, num_workers=0, audit_dir=directory))
    (record,) = directory.glob("rank*.jsonl")
    return record


def test_a_last_line_cut_short_is_skipped_with_a_warning(make_dataset: Any,
                                                        tmp_path: Path) -> None:
    record = _one_epoch(make_dataset, tmp_path)
    with open(record, "a", encoding="utf-8") as f:
        f.write('{"epoch":1,"batch":0,"wor')  # the process died here
    with pytest.warns(UserWarning, match=f"{record.name}: line 6 is cut short"):
        (report,) = pqloader.audit(tmp_path)
    assert report.exactly_once and report.delivered == 200
    with pytest.warns(UserWarning, match="cut short"):
        assert main(["audit", str(tmp_path)]) == 0


def test_a_file_cut_short_in_its_header_is_skipped(make_dataset: Any, tmp_path: Path) -> None:
    _one_epoch(make_dataset, tmp_path)
    (tmp_path / "rank00001-1-deadbeef.jsonl").write_text('{"format":"pqloader.au')
    with pytest.warns(UserWarning, match=r"rank00001-1-deadbeef\.jsonl: line 1.*holds no batch"):
        (report,) = pqloader.audit(tmp_path)
    assert report.exactly_once and report.batches_per_rank == {0: 4}


def test_a_damaged_line_before_the_last_is_an_error(make_dataset: Any, tmp_path: Path) -> None:
    record = _one_epoch(make_dataset, tmp_path)
    lines = record.read_text().splitlines(keepends=True)
    lines[2] = '{"epoch":0,"bat\n'
    record.write_text("".join(lines))
    with pytest.raises(pqloader.InvalidArgumentError, match=f"{record.name}: line 3 is not"):
        pqloader.audit(tmp_path)
    assert main(["audit", str(tmp_path)]) == 1


def _half(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v[: len(v) // 2] for k, v in batch.items()}


def test_a_transform_that_changes_a_batchs_rows_is_told_and_left_unchecked(
        make_dataset: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The rows read are recorded: those a transform left out passed for delivered once
    (found in review: 1,500 of 3,000 rows delivered, "every row exactly once", exit 0)."""
    ds = pqloader.ParquetDataset(make_dataset(1000))
    with pytest.warns(RuntimeWarning, match="a batch of 64 rows left transform/collate_fn "
                      "with 32"):
        list(pqloader.DataLoader(ds, batch_size=64, transform=_half, audit_dir=tmp_path))
    (report,) = pqloader.audit(tmp_path)
    assert report.reshaped == 16 and not report.exactly_once
    assert main(["audit", str(tmp_path)]) == 1
    assert "16 batches left a transform or collate_fn with other rows" in capsys.readouterr().out


def test_a_plans_padding_counts_once_however_many_runs_delivered_it(
        make_dataset: Any, tmp_path: Path) -> None:
    """Each run's record files added a world's padding: 2 rows a restart delivered again
    (its last batch before a kill, after the state it resumed from) passed for padding in a
    world of 2 whose rows divide evenly (found in review)."""
    ds = pqloader.ParquetDataset(make_dataset(1000))
    kw: dict[str, Any] = {"batch_size": 1, "shuffle": True, "seed": 3, "world_size": 2,
                          "audit_dir": tmp_path}
    states = []
    for rank in range(2):  # the first run: a state after 10 batches, one more, then killed
        loader = pqloader.DataLoader(ds, rank=rank, **kw)
        it = iter(loader)
        for _ in range(10):
            next(it)
        states.append(loader.state_dict())
        next(it)
    for rank in range(2):  # the restart, from the states
        loader = pqloader.DataLoader(ds, rank=rank, **kw)
        loader.load_state_dict(states[rank])
        list(loader)
    (report,) = pqloader.audit(tmp_path)
    assert (report.duplicates, report.padding) == (2, 0) and not report.exactly_once


def test_padding_may_bring_a_row_three_times(make_dataset: Any, tmp_path: Path) -> None:
    """1 row left for 3 ranks: it comes 3 times, within the 2 repeats a world of 3 pads with;
    the audit wanted each padding row exactly twice (found in review: exit 1)."""
    ds = pqloader.ParquetDataset(make_dataset(1001))
    kw: dict[str, Any] = {"shuffle": True, "seed": 3, "audit_dir": tmp_path}
    first = pqloader.DataLoader(ds, batch_size=500, **kw)
    it = iter(first)
    next(it)
    next(it)
    state = first.state_dict()  # 1 row left
    _resume_everywhere(ds, state, batch_size=500, world_size=3, **kw)
    (report,) = pqloader.audit(tmp_path)
    assert (report.duplicates, report.missing, report.padding) == (0, 0, 2)
    assert report.exactly_once


def test_an_empty_record_file_is_skipped_and_garbled_rows_are_damage(
        make_dataset: Any, tmp_path: Path) -> None:
    ds = pqloader.ParquetDataset(make_dataset(100))
    list(pqloader.DataLoader(ds, batch_size=10, audit_dir=tmp_path / "a"))
    (tmp_path / "a" / "rank00001-1-0.jsonl").write_text("")  # killed as it started
    with pytest.warns(UserWarning, match="empty"):
        assert pqloader.audit(tmp_path / "a")[0].exactly_once
    (record,) = (tmp_path / "a").glob("rank00000-*.jsonl")
    lines = record.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["rows"] = "AAAA"  # base64, not zlib
    record.write_text("\n".join([lines[0], json.dumps(bad), *lines[2:]]) + "\n")
    with pytest.raises(pqloader.InvalidArgumentError, match="the file is damaged"):
        pqloader.audit(tmp_path / "a")


def _with_a_scalar(batch: dict[str, Any]) -> dict[str, Any]:
    return {**batch, "weight": torch.tensor(0.5), "scale": np.float32(2)}


class _Opaque:
    def __init__(self, batch: Any) -> None:
        self.batch = batch


@pytest.mark.parametrize(("kw", "lost"), [
    ({"transform": lambda b: b["id"][1:]}, True),  # a bare tensor
    ({"transform": lambda b: b["id"]}, False),
    ({"transform": lambda b: {"inputs": {"id": b["id"][1:]}, "n": 3}}, True),  # nested
    ({"transform": lambda b: {"inputs": {"id": b["id"]}, "pair": (b["id"], b["id"])}}, False),
    ({"collate_fn": lambda rb: rb.slice(1)}, True),  # an Arrow batch
    ({"collate_fn": lambda rb: rb}, False),
    ({"collate_fn": lambda rb: rb.to_pylist()[1:]}, True),  # rows as dicts
    ({"collate_fn": lambda rb: rb.to_pylist()}, False),
    ({"transform": _Opaque}, True),  # no rows to count: unchecked, not passed
], ids=["tensor-", "tensor", "nested-", "nested", "arrow-", "arrow", "rows-", "rows",
        "opaque"])
def test_rows_a_transform_drops_are_told_whatever_it_returns(
        make_dataset: Any, tmp_path: Path, kw: dict[str, Any], lost: bool) -> None:
    """Only flat dicts, tuples and lists were counted: a batch returned as a bare tensor, a
    nested dict, an Arrow batch or a list of row dicts, one row short, passed the audit as
    exactly once (found by fuzzing); one the audit cannot count is left unchecked."""
    ds = pqloader.ParquetDataset(make_dataset(50))
    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        assert len(list(pqloader.DataLoader(ds, batch_size=10, audit_dir=tmp_path,
                                            **kw))) == 5
    (report,) = pqloader.audit(tmp_path)
    assert report.exactly_once is not lost and report.reshaped == (5 if lost else 0)
    assert any("audit_dir: a batch of 10 rows" in str(w.message) for w in told) is lost


def test_a_transform_adding_scalars_keeps_its_batches_checked(make_dataset: Any,
                                                              tmp_path: Path) -> None:
    """A 0-d tensor or a numpy scalar beside the columns has no rows to compare (len() of
    it failed the batch)."""
    ds = pqloader.ParquetDataset(make_dataset(100))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert len(list(pqloader.DataLoader(ds, batch_size=10, transform=_with_a_scalar,
                                            audit_dir=tmp_path))) == 10
    (report,) = pqloader.audit(tmp_path)
    assert report.exactly_once and report.reshaped == 0
