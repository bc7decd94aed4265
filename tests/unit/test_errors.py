"""Every error pqloader raises: its class, its builtin base, and a message naming the culprit."""

from __future__ import annotations

import datetime
import gc
import multiprocessing
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader

FAST_S = 10.0  # "within seconds": generous for a loaded 2-core machine, far below a hang


def _table(rows: int = 1000, start: int = 0) -> pa.Table:
    ids = np.arange(start, start + rows, dtype=np.int64)
    return pa.table({"id": ids, "text": [f"row {i}" for i in ids]})


def _drop_tracebacks(exc: BaseException | None) -> None:
    # A worker error re-raised by torch sits in a reference cycle (exception -> traceback ->
    # frame -> exception) that also holds torch's iterator. Left to the cyclic GC, the iterator's
    # __del__ then runs after the queues' finalizers and waits 2 x 5 s for its workers. Cutting
    # the traceback lets reference counting shut the workers down at once.
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


def drain(loader: Iterable[Any]) -> tuple[BaseException | None, list[int], float]:
    """Iterate ``loader``: (the error it raised or None, the ids seen before it, seconds)."""
    seen: list[int] = []
    start = time.monotonic()
    try:
        for batch in loader:
            seen.extend(batch["id"].tolist())
    except Exception as exc:
        elapsed = time.monotonic() - start
        _drop_tracebacks(exc)
        return exc, seen, elapsed
    return None, seen, time.monotonic() - start


def _assert_error(exc: BaseException, cls: type, builtin: type, *names: object) -> None:
    assert isinstance(exc, cls)
    assert isinstance(exc, builtin)
    assert isinstance(exc, pqloader.PQLoaderError)
    for name in names:
        assert str(name) in str(exc), f"{name!r} not named in {exc}"


# -- opening a source ----------------------------------------------------------------------------
def test_missing_path(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "dataset"
    with pytest.raises(FileNotFoundError) as info:
        pqloader.ParquetDataset(path)
    _assert_error(info.value, pqloader.DatasetNotFoundError, FileNotFoundError, path)


@pytest.mark.parametrize("path", ["", " ", "file://"])
def test_an_empty_path_is_refused_not_read_as_the_working_directory(path: str) -> None:
    """Path("") is "." : pqloader inspect "" read whatever folder it ran in (found in review)."""
    with pytest.raises(ValueError, match="the path is empty") as info:
        pqloader.ParquetDataset(path)
    _assert_error(info.value, pqloader.InvalidArgumentError, ValueError)


def test_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        pqloader.ParquetDataset(tmp_path)
    _assert_error(info.value, pqloader.EmptyDatasetError, FileNotFoundError, tmp_path)


def test_directory_with_only_success_marker(tmp_path: Path) -> None:
    (tmp_path / "_SUCCESS").touch()
    (tmp_path / ".part-00000.parquet.crc").write_bytes(b"crc")
    with pytest.raises(pqloader.EmptyDatasetError) as info:
        pqloader.ParquetDataset(tmp_path)
    _assert_error(info.value, pqloader.EmptyDatasetError, FileNotFoundError, tmp_path)


def test_empty_glob_and_empty_list(tmp_path: Path) -> None:
    with pytest.raises(pqloader.EmptyDatasetError, match=r"\*\.parquet"):
        pqloader.ParquetDataset(str(tmp_path / "*.parquet"))
    with pytest.raises(pqloader.EmptyDatasetError):
        pqloader.ParquetDataset([])


def test_text_file_is_not_parquet(tmp_path: Path) -> None:
    pq.write_table(_table(10), tmp_path / "part-00000.parquet")
    bad = tmp_path / "part-00001.parquet"
    bad.write_text("id,text\n1,hello\n" * 50)
    with pytest.raises(OSError) as info:
        pqloader.ParquetDataset(tmp_path)
    _assert_error(info.value, pqloader.CorruptFileError, OSError, bad)


def test_truncated_parquet_file(tmp_path: Path) -> None:
    path = tmp_path / "part-00000.parquet"
    pq.write_table(_table(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])  # the footer is cut
    with pytest.raises(pqloader.CorruptFileError) as info:
        pqloader.ParquetDataset(path)
    _assert_error(info.value, pqloader.CorruptFileError, OSError, path)


# -- a corrupt data page: the footer is fine, the error comes when reading ------------------------
@pytest.fixture
def corrupt_dataset(tmp_path: Path) -> tuple[Path, Path]:
    """Two files of 1000 rows (row groups of 500); row group 1 of the second has a bad page."""
    root = tmp_path / "corrupt"
    root.mkdir()
    pq.write_table(_table(1000), root / "part-00000.parquet", row_group_size=500)
    bad = root / "part-00001.parquet"
    pq.write_table(_table(1000, start=1000), bad, row_group_size=500, compression="none")
    chunk = pq.read_metadata(bad).row_group(1).column(0)  # 'id', dictionary encoded
    end = (chunk.dictionary_page_offset or chunk.data_page_offset) + chunk.total_compressed_size
    middle = (chunk.data_page_offset + end) // 2  # inside the data page's encoded indices
    with bad.open("r+b") as f:
        f.seek(middle)
        f.write(b"\xff" * 64)
    pq.read_metadata(bad)  # the footer is intact
    return root, bad


def test_corrupt_page_via_getitem(corrupt_dataset: tuple[Path, Path]) -> None:
    root, bad = corrupt_dataset
    ds = pqloader.ParquetDataset(root)  # opening reads only footers: no error yet
    assert len(ds) == 2000
    assert ds[1499]["id"] == 1499  # row group 0 of the damaged file still reads
    with pytest.raises(OSError) as info:
        ds[1500]
    _assert_error(info.value, pqloader.CorruptFileError, OSError, bad, "row group 1")


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_corrupt_page_via_loader(corrupt_dataset: tuple[Path, Path], worker_type: str) -> None:
    root, bad = corrupt_dataset
    loader = pqloader.DataLoader(pqloader.ParquetDataset(root), batch_size=100, num_workers=2,
                                 worker_type=worker_type)  # type: ignore[arg-type]
    exc, seen, elapsed = drain(loader)
    assert elapsed < FAST_S
    assert exc is not None, "the epoch ended without an error"
    assert len(seen) < 2000
    assert isinstance(exc, pqloader.CorruptFileError)  # torch re-raises the same type
    assert isinstance(exc, OSError)
    assert str(bad) in str(exc)
    assert "row group 1" in str(exc)


# -- schemas and columns --------------------------------------------------------------------------
def test_schema_mismatch_names_both_files_and_column(tmp_path: Path) -> None:
    first, second = tmp_path / "part-00000.parquet", tmp_path / "part-00001.parquet"
    pq.write_table(_table(10), first)
    other = _table(10).set_column(1, "text", pa.array(np.arange(10.0)))
    pq.write_table(other, second)
    with pytest.raises(ValueError) as info:
        pqloader.ParquetDataset(tmp_path)
    _assert_error(info.value, pqloader.SchemaMismatchError, ValueError, first, second, "'text'")


@pytest.mark.parametrize("missing_in", ["first", "second"])
def test_missing_column_in_one_file(tmp_path: Path, missing_in: str) -> None:
    first, second = tmp_path / "part-00000.parquet", tmp_path / "part-00001.parquet"
    narrow = _table(10).select(["id"])
    pq.write_table(narrow if missing_in == "first" else _table(10), first)
    pq.write_table(narrow if missing_in == "second" else _table(10), second)
    with pytest.raises(pqloader.SchemaMismatchError) as info:
        pqloader.ParquetDataset(tmp_path)
    _assert_error(info.value, pqloader.SchemaMismatchError, ValueError, first, second, "'text'")
    # the columns both files share still open
    assert len(pqloader.ParquetDataset(tmp_path, columns=["id"])) == 20


def test_unknown_column(tmp_path: Path) -> None:
    pq.write_table(_table(10), tmp_path / "part-00000.parquet")
    with pytest.raises(KeyError) as info:
        pqloader.ParquetDataset(tmp_path, columns=["id", "label"])
    _assert_error(info.value, pqloader.ColumnNotFoundError, KeyError, "'label'")
    message = str(info.value)
    assert not message.startswith(("'", '"')), "str() must not be the repr KeyError gives"
    assert "\\" not in message


# -- arguments ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 8, "num_workers": -1}, "num_workers"),
        ({"batch_size": 8, "rank": 3, "world_size": 3}, "rank"),
        ({"batch_size": 8, "rank": 1}, "world_size"),
        ({"batch_size": 8, "prefetch_factor": 0}, "prefetch_factor"),
        ({"batch_size": 8, "seed": -1}, "seed"),
        ({"batch_size": 8, "timeout": -1}, "timeout"),
        ({"batch_size": 8, "timeout": float("inf")}, "timeout"),  # overflowed a wait
        ({"batch_size": 8, "timeout": float("nan")}, "timeout"),  # timed out at once
        ({"batch_size": 8, "worker_type": "fiber"}, "worker_type"),
        ({"batch_size": 8, "num_workers": 0, "persistent_workers": True}, "persistent_workers"),
        ({"batch_size": 8, "shuffle": "no"}, "shuffle must be True or False"),  # was True
        ({"batch_size": 8, "pin_memory": "yes"}, "pin_memory must be True or False"),
        ({"batch_size": 8, "num_workers": "2"}, "int >= 0 or 'auto', got '2'"),
        # torch's habits: Python's bare "unexpected keyword argument" before
        ({"batch_size": 8, "sampler": [0, 1]}, "sampler= is torch's: pqloader.DataLoader "
                                               "orders the rows itself"),
        ({"batch_size": 8, "generator": object()}, "generator= is torch's"),
        ({"batch_size": 8, "in_order": False}, "in_order=False: pqloader.DataLoader yields "
                                               "batches in the plan's order always"),
        ({"batch_size": 8, "pin_memory_device": "cuda"}, "device='cuda' delivers"),
    ],
)
def test_bad_loader_arguments(tmp_path: Path, kwargs: dict[str, Any], name: str) -> None:
    pq.write_table(_table(10), tmp_path / "part-00000.parquet")
    ds = pqloader.ParquetDataset(tmp_path)
    with pytest.raises(ValueError) as info:
        pqloader.DataLoader(ds, **kwargs)
    _assert_error(info.value, pqloader.InvalidArgumentError, ValueError, name)


def test_a_path_or_another_dataset_given_to_the_loader_says_what_to_do(tmp_path: Path) -> None:
    """The README's 'DataLoader(ParquetDataset(path))' is easy to shorten to DataLoader(path)."""
    import torch.utils.data

    for given, told in ((str(tmp_path), "open it first, pqloader.DataLoader(pqloader."
                                        f"ParquetDataset({str(tmp_path)!r})"),
                        (tmp_path, "open it first"),
                        (torch.utils.data.TensorDataset(torch.zeros(3)),
                         "use torch.utils.data.DataLoader"),
                        (None, "got NoneType")):
        with pytest.raises(pqloader.InvalidArgumentError, match=re.escape(told)):
            pqloader.DataLoader(given, batch_size=4)  # type: ignore[arg-type]


def test_the_loader_has_torchs_attributes_and_takes_batch_size_second(tmp_path: Path) -> None:
    """Logging and frameworks read loader.num_workers, .drop_last, ...: AttributeError before;
    DataLoader(ds, 32) was "takes 2 positional arguments"."""
    pq.write_table(_table(10), tmp_path / "part-00000.parquet")
    ds = pqloader.ParquetDataset(tmp_path)
    loader = pqloader.DataLoader(ds, 4, num_workers="auto", drop_last=1, timeout=5,
                                 prefetch_factor=None, in_order=True)
    assert loader.batch_size == 4 and loader.num_workers == "auto" and loader.drop_last is True
    assert (loader.pin_memory, loader.timeout, loader.prefetch_factor) == (False, 5, 2)
    assert (loader.persistent_workers, loader.collate_fn, loader.worker_init_fn) == (
        False, None, None)
    assert loader.multiprocessing_context is None and loader.in_order is True


def test_yes_or_no_arguments_take_what_torch_takes(tmp_path: Path) -> None:
    """0 and 1 (configs from YAML or argparse), numpy's and torch's booleans, as torch's
    DataLoader takes them; made bools, so that every rank's settings compare alike."""
    import torch

    pq.write_table(_table(10), tmp_path / "part-00000.parquet")
    ds = pqloader.ParquetDataset(tmp_path)
    for yes in (1, np.bool_(True), torch.tensor(True)):
        loader = pqloader.DataLoader(ds, batch_size=4, shuffle=yes, drop_last=yes,
                                     pin_memory=0, num_workers=1, persistent_workers=yes)
        assert loader.config.shuffle is True and loader.config.drop_last is True
        assert loader.state_dict()["settings"]["shuffle"] is True
    assert ds.to_torch(batch_size=4, shuffle=1)._planner.config.shuffle is True
    for no in (0.5, float("inf"), np.array([1]), torch.tensor([1])):  # inf: OverflowError
        with pytest.raises(pqloader.InvalidArgumentError, match="shuffle must be True or "):
            pqloader.DataLoader(ds, batch_size=4, shuffle=no)


def test_the_loader_given_to_torchs_dataloader_says_what_to_do(tmp_path: Path) -> None:
    """torch's DataLoader took it for a map-style dataset: "'DataLoader' object is not
    subscriptable" (a first-use mistake, found in review)."""
    import torch

    pq.write_table(_table(10), tmp_path / "part-00000.parquet")
    loader = pqloader.DataLoader(pqloader.ParquetDataset(tmp_path), batch_size=4)
    with pytest.raises(TypeError, match=r"yields batches itself: iterate it directly.*"
                       r"ds\.to_torch\(batch_size=\.\.\.\) with batch_size=None"):
        next(iter(torch.utils.data.DataLoader(loader, batch_size=None)))


def test_prefetch_factor_none_is_torchs_default(tmp_path: Path) -> None:
    pq.write_table(_table(10), tmp_path / "part-00000.parquet")
    loader = pqloader.DataLoader(pqloader.ParquetDataset(tmp_path), batch_size=4,
                                 prefetch_factor=None)
    assert sum(len(b["id"]) for b in loader) == 10


def test_bad_set_epoch(tmp_path: Path) -> None:
    pq.write_table(_table(10), tmp_path / "part-00000.parquet")
    loader = pqloader.DataLoader(pqloader.ParquetDataset(tmp_path), batch_size=4)
    with pytest.raises(pqloader.InvalidArgumentError, match="epoch"):
        loader.set_epoch(-1)


def test_struct_column_rejected_at_construction(tmp_path: Path) -> None:
    table = pa.table({"id": np.arange(10), "meta": pa.array([{"a": i} for i in range(10)])})
    pq.write_table(table, tmp_path / "part-00000.parquet")
    ds = pqloader.ParquetDataset(tmp_path)
    with pytest.raises(ValueError) as info:
        pqloader.DataLoader(ds, batch_size=4)
    _assert_error(info.value, pqloader.InvalidArgumentError, ValueError, "'meta'", "columns=",
                  "collate_fn=")
    # both suggested ways out work
    batches = list(pqloader.DataLoader(pqloader.ParquetDataset(tmp_path, columns=["id"]),
                                       batch_size=4, num_workers=0))
    assert sum(len(b["id"]) for b in batches) == 10
    rows = list(pqloader.DataLoader(ds, batch_size=4, num_workers=0,
                                    collate_fn=lambda rb: rb.column("meta").to_pylist()))
    assert [r for batch in rows for r in batch] == [{"a": i} for i in range(10)]


@pytest.mark.parametrize("mode", [
    pytest.param({"num_workers": 0}, id="inline"),
    pytest.param({"num_workers": 2}, id="threads"),
    pytest.param({"num_workers": 2, "worker_type": "process"}, id="processes"),
])
def test_nulls_in_int_column(tmp_path: Path, mode: dict[str, Any]) -> None:
    ids = pa.array([None if i == 37 else i for i in range(100)], pa.int64())
    pq.write_table(pa.table({"id": ids}), tmp_path / "part-00000.parquet", row_group_size=25,
                   write_statistics=False)  # (told by the batch: the footers do not say)
    loader = pqloader.DataLoader(pqloader.ParquetDataset(tmp_path), batch_size=10, **mode)
    exc, _, _ = drain(loader)
    assert exc is not None
    _assert_error(exc, pqloader.DataError, ValueError, "'id'", "null")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_nulls_error_names_the_file(tmp_path: Path, num_workers: int) -> None:
    pq.write_table(pa.table({"id": pa.array(range(100), pa.int64())}), tmp_path / "a.parquet")
    bad = tmp_path / "b.parquet"
    ids = pa.array([None if i == 137 else i for i in range(100, 200)], pa.int64())
    pq.write_table(pa.table({"id": ids}), bad, row_group_size=50, write_statistics=False)
    loader = pqloader.DataLoader(pqloader.ParquetDataset(tmp_path), batch_size=10,
                                 num_workers=num_workers)
    exc, _, _ = drain(loader)
    assert isinstance(exc, pqloader.DataError)
    told = "\n".join([str(exc), *getattr(exc, "__notes__", [])])
    assert str(bad) in told
    assert "row group 0" in told


@pytest.mark.parametrize("where", ["loader", "to_torch"])
def test_nulls_the_footers_count_are_told_as_the_loader_is_built(tmp_path: Path,
                                                                 where: str) -> None:
    """Told by the batch holding the first, they stopped a run 490 batches in (found in
    review): the footers' statistics said so before the first batch."""
    pq.write_table(pa.table({"id": pa.array(range(100), pa.int64())}), tmp_path / "a.parquet")
    ids = pa.array([None if i % 7 == 0 and i >= 150 else i for i in range(100, 200)])
    pq.write_table(pa.table({"id": ids}), tmp_path / "b.parquet", row_group_size=50)
    ds = pqloader.ParquetDataset(tmp_path)
    with pytest.raises(pqloader.DataError, match=r"'id' \(int64\) has null values \(7 by the "
                       rf"footers' statistics, the first in {tmp_path / 'b.parquet'}: row "
                       r"group 1\).*cast the column to float"):
        if where == "loader":
            pqloader.DataLoader(ds, batch_size=10)
        else:
            ds.to_torch(batch_size=10)
    kept = pqloader.ParquetDataset(tmp_path, filter=[("id", "<", 150)])  # (may drop them)
    assert sum(len(b["id"]) for b in pqloader.DataLoader(kept, batch_size=10)) == 150
    arrow = pqloader.DataLoader(ds, batch_size=10, collate_fn=lambda rb: rb.num_rows)
    assert sum(arrow) == 200  # nulls are Arrow's to hold


def test_an_empty_file_in_a_null_hive_folder_holds_no_null(tmp_path: Path) -> None:
    """A file of 0 rows under year=__HIVE_DEFAULT_PARTITION__ made the loader refuse an int
    hive column whose every row was 2024, saying it counted 0 nulls (found by fuzzing); a
    file with rows there is still refused."""
    (tmp_path / "year=2024").mkdir()
    (tmp_path / "year=__HIVE_DEFAULT_PARTITION__").mkdir()
    pq.write_table(pa.table({"x": [1.0, 2.0]}), tmp_path / "year=2024" / "part-0.parquet")
    pq.write_table(pa.table({"x": pa.array([], pa.float64())}),
                   tmp_path / "year=__HIVE_DEFAULT_PARTITION__" / "part-0.parquet")
    ds = pqloader.ParquetDataset(tmp_path)
    (batch,) = pqloader.DataLoader(ds, batch_size=4, num_workers=0)
    assert batch["year"].tolist() == [2024, 2024]
    pq.write_table(pa.table({"x": [3.0]}),
                   tmp_path / "year=__HIVE_DEFAULT_PARTITION__" / "part-1.parquet")
    with pytest.raises(pqloader.DataError, match=r"'year' \(int64\) has null values \(1 by"):
        pqloader.DataLoader(pqloader.ParquetDataset(tmp_path), batch_size=4)


def test_dates_python_cannot_hold_are_named_not_raw_overflows(tmp_path: Path) -> None:
    """A filter literal past Python's dates (pyarrow takes it) failed the open with a bare
    OverflowError, and ds[i] of such a value too (found by fuzzing)."""
    pq.write_table(pa.table({"t": pa.array([0, 5], pa.timestamp("us")),
                             "d": pa.array([0, 3_000_000], pa.date32())}), tmp_path / "a.parquet")
    import pyarrow.compute as pc

    for kept in (pc.field("t") > pa.scalar(-10**17, pa.timestamp("us")),  # year -1199
                 pc.field("d") < pa.scalar(3_000_001, pa.date32())):  # year 10183
        ds = pqloader.ParquetDataset(tmp_path, filter=kept)
        assert len(ds) == 2 and sum(len(b["t"]) for b in pqloader.DataLoader(ds, batch_size=2)) == 2
    ds = pqloader.ParquetDataset(tmp_path)
    assert ds[0]["d"] == datetime.date(1970, 1, 1)
    with pytest.raises(pqloader.DataError, match=r"column 'd' \(date32\[day\]\) holds a value"):
        ds[1]
    (batch,) = pqloader.DataLoader(ds, batch_size=2, num_workers=0)
    assert batch["d"].tolist() == [0, 3_000_000]


# -- failures in the workers ----------------------------------------------------------------------
class Boom:
    """A transform that fails on the batch holding row ``bad`` (picklable for processes)."""

    def __init__(self, bad: int) -> None:
        self.bad = bad

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        if self.bad in batch["id"].tolist():
            raise ValueError("boom")
        return batch


class Sleepy:
    """A transform that takes ``seconds`` per batch."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        time.sleep(self.seconds)
        return batch


MODES = [
    pytest.param({"num_workers": 0}, id="inline"),
    pytest.param({"num_workers": 2}, id="threads"),
    pytest.param({"num_workers": 2, "worker_type": "process"}, id="processes"),
]


@pytest.mark.parametrize("bad", [0, 555, 999])
@pytest.mark.parametrize("mode", MODES)
def test_failing_transform_reaches_caller(make_dataset: Any, mode: dict[str, Any],
                                          bad: int) -> None:
    ds = pqloader.ParquetDataset(make_dataset(1000), columns=["id"])
    loader = pqloader.DataLoader(ds, batch_size=50, shuffle=True, transform=Boom(bad), **mode)
    exc, seen, elapsed = drain(loader)
    assert elapsed < FAST_S
    assert exc is not None, "the epoch ended, shorter, without the transform's error"
    assert type(exc) is ValueError  # the original type, not a wrapper
    assert "boom" in str(exc)
    assert bad not in seen
    assert len(seen) < 1000


def test_failing_transform_names_its_batch(make_dataset: Any) -> None:
    ds = pqloader.ParquetDataset(make_dataset(200), columns=["id"])
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=2, transform=Boom(120))
    with pytest.raises(ValueError, match="boom") as info:
        list(loader)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "transform" in notes and "epoch 0" in notes


def test_failing_transform_names_its_batch_of_the_epoch_after_an_elastic_resume(
        make_dataset: Any) -> None:
    """Resumed with other workers, batches are counted again from 0 in the new plan; the
    error named that count, not the batch of the epoch its generator is drawn for (found in
    review: "batch 2" for the epoch's ninth batch). Here 6 batches, then 5, then the error."""
    ds = pqloader.ParquetDataset(make_dataset(1000), columns=["id"])
    saver = pqloader.DataLoader(ds, batch_size=50, num_workers=2)
    it = iter(saver)
    for _ in range(6):
        next(it)
    state = saver.state_dict()
    del it
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=0, transform=Boom(400))
    loader.load_state_dict(state)
    exc, seen, _ = drain(loader)
    assert isinstance(exc, ValueError) and len(seen) == 5 * 50
    assert "in pqloader transform, batch 11 of rank 0, epoch 0" in " ".join(exc.__notes__)


@pytest.mark.parametrize("workers", [0, 2, "auto"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_failing_transform_names_the_row_groups_its_rows_came_from(
        make_dataset: Any, workers: int | str, shuffle: bool) -> None:
    """A bad image or sample: the note names where the batch's rows were read (only those
    of the batch's own rows, not all of its window's), as a read error names its row group."""
    ds = pqloader.ParquetDataset(make_dataset(1000, rows_per_file=300, row_group_size=100),
                                 columns=["id"])
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=workers, shuffle=shuffle,
                                 seed=1, transform=Boom(555))  # file 1, row group 2
    with pytest.raises(ValueError, match="boom") as info:
        list(loader)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "part-00001.parquet: row group 2" in notes, notes
    named = notes.count(": row group")
    if shuffle:
        assert 1 < named <= 8 + 1, notes  # a window's rows: several row groups
    else:
        assert named == 1, notes  # rows 550..599, all of that row group


def test_failing_collate_fn_names_its_batch(make_dataset: Any) -> None:
    def collate(batch: pa.RecordBatch) -> Any:
        raise ValueError("bad collate")

    ds = pqloader.ParquetDataset(make_dataset(200), columns=["id"])
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=0, collate_fn=collate)
    with pytest.raises(ValueError, match="bad collate") as info:
        list(loader)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "collate_fn, batch 0" in notes and "epoch 0" in notes


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
@pytest.mark.parametrize("name", ["transform", "collate_fn", "worker_init_fn"])
def test_a_callable_that_does_not_pickle_is_named_where_workers_are_not_forked(
        make_dataset: Any, context: str, name: str) -> None:
    def nested(arg: Any) -> Any:  # a nested function: pickle cannot find it by name
        return arg

    ds = pqloader.ParquetDataset(make_dataset(200), columns=["id"])
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=1, worker_type="process",
                                 multiprocessing_context=context, **{name: nested})
    with pytest.raises(pqloader.InvalidArgumentError,
                       match=rf"^{name}=.*nested.* does not pickle .*'{context}'.*top level"):
        next(iter(loader))


class _HoldsASpawnLock:
    """A transform that pickles for a process being started, and only then."""

    def __init__(self) -> None:
        self.lock = multiprocessing.get_context("spawn").Lock()

    def __call__(self, batch: Any) -> Any:
        return batch


def test_a_transform_that_pickles_for_a_new_process_is_not_blamed_for_another_part(
        make_dataset: Any) -> None:
    def nested(batch: Any) -> Any:
        return batch

    ds = pqloader.ParquetDataset(make_dataset(200), columns=["id"])
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=1, worker_type="process",
                                 multiprocessing_context="spawn", transform=_HoldsASpawnLock(),
                                 collate_fn=nested)
    with pytest.raises(pqloader.InvalidArgumentError, match=r"^collate_fn=.*nested"):
        next(iter(loader))


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param({"num_workers": 2}, id="threads"),
        pytest.param({"num_workers": 2, "worker_type": "process"}, id="processes"),
    ],
)
def test_timeout(make_dataset: Any, mode: dict[str, Any]) -> None:
    ds = pqloader.ParquetDataset(make_dataset(200), columns=["id"])
    loader = pqloader.DataLoader(ds, batch_size=50, transform=Sleepy(3), timeout=0.5, **mode)
    exc, _, elapsed = drain(loader)
    assert isinstance(exc, pqloader.LoaderTimeoutError)
    assert isinstance(exc, TimeoutError)
    assert "timeout" in str(exc)
    assert elapsed < 2.5, f"LoaderTimeoutError came after {elapsed:.1f} s, not ~0.5 s"
    # (below the transform's 3 s a batch: ~0.5 s, with a fork's start on a loaded machine)


def test_timeout_threads_eventually_raises(make_dataset: Any) -> None:
    """A transform slower than the timeout but not stuck: the error still comes promptly."""
    ds = pqloader.ParquetDataset(make_dataset(200), columns=["id"])
    loader = pqloader.DataLoader(ds, batch_size=50, transform=Sleepy(1.5), timeout=0.5,
                                 num_workers=2)
    exc, _, elapsed = drain(loader)
    assert isinstance(exc, pqloader.LoaderTimeoutError)
    assert elapsed < FAST_S


def _children_left(before: set[int], wait_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + wait_s
    while True:
        left = [p for p in psutil.Process().children(recursive=True)
                if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def test_worker_processes_exit_after_error(make_dataset: Any) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    ds = pqloader.ParquetDataset(make_dataset(200), columns=["id"])
    loader = pqloader.DataLoader(ds, batch_size=50, num_workers=2, worker_type="process",
                                 transform=Boom(120))
    error: BaseException | None = None
    gc.disable()  # an automatic collection would hide (and pay 10 s for) what is tested here
    try:
        try:
            for _ in loader:
                pass
        except ValueError as exc:
            error = exc
        assert error is not None
        left = _children_left(before, wait_s=2.0)
    finally:
        gc.enable()
        _drop_tracebacks(error)  # whatever the outcome, free the workers now
        del error
        gc.collect()
    assert not left, f"worker processes still running after the error: {left}"


def test_verify_checksums_catches_a_corrupt_page(tmp_path: Path) -> None:
    """Random floats decode to wrong values silently; page CRCs written by write_dataset don't."""
    values = np.random.default_rng(0).standard_normal(100_000).astype(np.float32)
    pqloader.write_dataset(pa.table({"x": values}), tmp_path / "d", compression="none",
                           progress=False)
    path = tmp_path / "d" / "part-00000.parquet"
    raw = bytearray(path.read_bytes())
    mid = len(raw) // 2
    raw[mid:mid + 64] = bytes(64)
    path.write_bytes(bytes(raw))
    unchecked = pqloader.ParquetDataset(tmp_path / "d")
    assert len(list(pqloader.DataLoader(unchecked, batch_size=50_000))) == 2  # silent
    checked = pqloader.ParquetDataset(tmp_path / "d", verify_checksums=True)
    with pytest.raises(pqloader.CorruptFileError, match=r"row group \d") as info:
        list(pqloader.DataLoader(checked, batch_size=50_000, num_workers=2))
    assert str(path) in str(info.value)


@pytest.mark.parametrize("values", [
    pa.array([None if i == 130 else i for i in range(400)], pa.int64()),
    # a null list (a row of length 0, no error) in row group 0, a null value in row group 2
    pa.array([None if i == 3 else [i, None] if i == 130 else [i] for i in range(400)],
             pa.list_(pa.int64())),
])
def test_nulls_in_a_window_name_the_row_groups_that_hold_them(tmp_path: Path,
                                                              values: pa.Array) -> None:
    """The note named every row group of the shuffle window (dozens, with 64 MiB windows)."""
    pq.write_table(pa.table({"v": values}), tmp_path / "a.parquet", row_group_size=50,
                   write_statistics=False)  # (else told as the loader is built)
    ds = pqloader.ParquetDataset(tmp_path)
    loader = pqloader.DataLoader(ds, batch_size=40, shuffle=True, shuffle_window_rows=400,
                                 num_workers=0)
    with pytest.raises(pqloader.DataError, match=r"'v' .*null values") as info:
        list(loader)
    assert info.value.__notes__ == [f"in {tmp_path / 'a.parquet'}: row group 2"]
