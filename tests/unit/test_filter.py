"""filter=: the rows kept, counted at open, and everything built on the counts; pyarrow's own
filtered read is the oracle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import pqloader
from pqloader import _read


@pytest.fixture
def path(tmp_path: Path) -> Path:
    """1,000 rows in 4 files of 100-row groups: ``id``, ``x``, ``label`` = id % 7, and ``score``
    with a null every 10th row."""
    rows = 1000
    ids = np.arange(rows, dtype=np.int64)
    table = pa.table({
        "id": ids,
        "x": np.random.default_rng(0).random(rows, dtype=np.float32),
        "label": ids % 7,
        "score": pa.array([None if i % 10 == 0 else float(i % 13) for i in range(rows)]),
    })
    out = tmp_path / "ds"
    pqloader.write_dataset(table, out, rows_per_file=300, row_group_size=100)
    return out


def _oracle(path: Path, expression: pc.Expression) -> list[int]:
    """The ids pyarrow's own filtered read keeps, in file order."""
    files = sorted(path.glob("*.parquet"))
    return pa.concat_tables(pq.read_table(f, filters=expression) for f in files)["id"].to_pylist()


def _ids(ds: pqloader.ParquetDataset) -> list[int]:
    return [row["id"] for row in ds.__getitems__(list(range(len(ds))))]


@pytest.mark.parametrize("expression", [
    pc.field("label") == 3,
    (pc.field("label") < 2) | (pc.field("x") > 0.9),
    pc.field("score") > 6,  # nulls: left out, as pyarrow and SQL's WHERE leave them
    pc.field("score").is_null(),
    ~pc.field("id").isin([5, 500, 999]),
])
def test_rows_kept_are_pyarrows(path: Path, expression: pc.Expression) -> None:
    ds = pqloader.ParquetDataset(path, filter=expression)
    expected = _oracle(path, expression)
    assert len(ds) == len(expected) == int(ds.fragment_rows.sum())
    assert _ids(ds) == expected  # file order, ds[i] and __getitems__ alike
    assert ds[len(ds) - 1]["id"] == expected[-1]
    assert ds.filter.equals(expression)


def test_dnf_tuples_as_pyarrow_takes_them(path: Path) -> None:
    dnf = [[("label", "=", 3), ("x", ">", 0.5)], [("id", "in", [0, 1, 2])]]
    ds = pqloader.ParquetDataset(path, filter=dnf)
    assert _ids(ds) == _oracle(path, pq.filters_to_expression(dnf))


def test_a_filter_reads_columns_it_does_not_show(path: Path) -> None:
    ds = pqloader.ParquetDataset(path, columns=["x"], filter=pc.field("label") == 3)
    assert list(ds.columns) == ["x"]
    assert list(ds[0]) == ["x"]
    loader = pqloader.DataLoader(ds, batch_size=32)
    assert all(list(batch) == ["x"] for batch in loader)
    assert sum(len(batch["x"]) for batch in loader) == len(_oracle(path, pc.field("label") == 3))


def test_row_groups_left_with_no_row_leave_the_index(path: Path) -> None:
    ds = pqloader.ParquetDataset(path, filter=pc.field("id") < 250)
    assert ds.fragment_rows.tolist() == [100, 100, 50]
    assert ds.num_row_groups == 3
    assert len(ds.files) == 4  # the files are the dataset's still
    assert "250 rows kept by filter (id < 250)" in repr(ds)


def test_a_filter_keeping_nothing_is_an_error(path: Path) -> None:
    with pytest.raises(pqloader.EmptyDatasetError, match=r"filter \(label == 9\) keeps none of "
                       r"the 1,000 rows of 4 files"):
        pqloader.ParquetDataset(path, filter=pc.field("label") == 9)


def test_bad_filters_are_named(path: Path) -> None:
    with pytest.raises(pqloader.ColumnNotFoundError, match=r"reads column 'lable', which "
                       r".*part-00000.parquet \(the first file\) does not have \(every file "
                       r"needs the filter's columns\); it has \['id', 'x', 'label', 'score'\]"
                       ) as info:
        pqloader.ParquetDataset(path, filter=pc.field("lable") == 3)
    assert isinstance(info.value, KeyError)
    with pytest.raises(pqloader.InvalidArgumentError, match=r"filter \(label > \"a\"\) does not "
                       "fit the columns' types"):
        pqloader.ParquetDataset(path, filter=pc.field("label") > "a")
    with pytest.raises(pqloader.InvalidArgumentError, match="must evaluate to bool"):
        pqloader.ParquetDataset(path, filter=pc.field("label") + 1)
    with pytest.raises(pqloader.InvalidArgumentError, match=r"\(column, op, value\) tuples"):
        pqloader.ParquetDataset(path, filter=[("label", "~", 3)])
    for value in ("label == 3", 3, []):
        with pytest.raises(pqloader.InvalidArgumentError, match=r"pyarrow\.compute expression"):
            pqloader.ParquetDataset(path, filter=value)


def test_a_filter_failing_on_values_names_the_row_group(path: Path) -> None:
    overflow = pc.multiply_checked(pc.field("id"), 2**62) > 0  # overflows from id 2
    with pytest.raises(pqloader.DataError, match=r"part-00000.parquet: row group 0: filter "
                       r".* failed on its values"):
        pqloader.ParquetDataset(path, filter=overflow)


def test_hive_partition_filters_read_no_data(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    for year in (2023, 2024):
        for split in ("train", "test"):
            folder = tmp_path / f"year={year}" / f"split={split}"
            folder.mkdir(parents=True)
            ids = np.arange(100) + 1000 * (year - 2023) + (500 if split == "test" else 0)
            pq.write_table(pa.table({"id": ids, "v": ids % 3}), folder / "part-0.parquet",
                           row_group_size=40)
    reads: list[int] = []
    real = _read.FragmentReader.read
    monkeypatch.setattr(_read.FragmentReader, "read",
                        lambda self, i: reads.append(i) or real(self, i))
    ds = pqloader.ParquetDataset(tmp_path, filter=(pc.field("year") == 2024) &
                                 (pc.field("split") == "train"))
    assert reads == []  # decided from the folders
    assert sorted(_ids(ds)) == list(range(1000, 1100))
    assert ds[0]["year"] == 2024 and ds[0]["split"] == "train"

    mixed = pqloader.ParquetDataset(tmp_path, columns=["id"],
                                    filter=(pc.field("split") == "test") & (pc.field("v") == 0))
    assert reads  # a file column: read
    assert sorted(_ids(mixed)) == [i for i in [*range(500, 600), *range(1500, 1600)] if i % 3 == 0]


def test_a_file_changed_under_its_filter_is_named(path: Path) -> None:
    ds = pqloader.ParquetDataset(path, filter=pc.field("label") == 3)
    first = path / "part-00000.parquet"
    table = pq.read_table(first)
    label = pc.if_else(pc.less(table["id"], 100), pa.scalar(3, pa.int64()), table["label"])
    pq.write_table(table.set_column(2, "label", label), first, row_group_size=100)
    # told by its size (a change at the same size: by the rows the filter keeps, "row group 0
    # holds 100 rows kept by the filter, the dataset's index 14")
    with pytest.raises(pqloader.SchemaMismatchError,
                       match=r"part-00000.parquet is [0-9,]+ bytes, [0-9,]+ when the dataset"):
        ds[0]


def test_resume_states_know_the_filter(path: Path) -> None:
    keep = pc.field("label") == 3
    loader = pqloader.DataLoader(pqloader.ParquetDataset(path, filter=keep), batch_size=16,
                                 shuffle=True, seed=1)
    seen = []
    for batch in loader:
        seen += batch["id"].tolist()
        if len(seen) >= 64:
            break
    state = json.loads(json.dumps(loader.state_dict()))
    other = pqloader.DataLoader(pqloader.ParquetDataset(path, filter=pc.field("label") == 4),
                                batch_size=16, shuffle=True, seed=1)
    with pytest.raises(pqloader.StateMismatchError, match="dataset"):
        other.load_state_dict(state)
    unfiltered = pqloader.DataLoader(pqloader.ParquetDataset(path), batch_size=16,
                                     shuffle=True, seed=1)
    with pytest.raises(pqloader.StateMismatchError, match="dataset"):
        unfiltered.load_state_dict(state)
    same = pqloader.DataLoader(pqloader.ParquetDataset(path, filter=[("label", "=", 3)]),
                               batch_size=16, shuffle=True, seed=1)
    same.load_state_dict(state)
    rest = [i for batch in same for i in batch["id"].tolist()]
    assert sorted(seen + rest) == _oracle(path, keep)


def test_remote_filter(path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    for f in sorted(path.glob("*.parquet")):
        memory.pipe(f"/filtered/{f.name}", f.read_bytes())
    keep = (pc.field("label") == 3) & pc.field("score").is_valid()
    ds = pqloader.ParquetDataset("memory://filtered/", columns=["id"], filter=keep)
    assert _ids(ds) == _oracle(path, keep)
    batches = pqloader.DataLoader(ds, batch_size=8, shuffle=True, seed=0, num_workers=2)
    assert sorted(i for b in batches for i in b["id"].tolist()) == _oracle(path, keep)


def test_filter_columns_unify_across_files(tmp_path: Path) -> None:
    """A filter column 'not null' in one file and nullable in another is read from both."""
    required = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    pq.write_table(pa.table({"id": [1, 2, 3]}, schema=required), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [4, None, 6]}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"id": [7, 8]}), tmp_path / "c.parquet")
    ds = pqloader.ParquetDataset(tmp_path, filter=pc.field("id") > 3)
    assert [r["id"] for r in ds.__getitems__(range(len(ds)))] == [4, 6, 7, 8]


def _spy_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The row groups read from now on, as ``folder/file:row_group``."""
    reads: list[str] = []
    real = _read.FragmentReader.read

    def read(self: _read.FragmentReader, i: int) -> pa.Table:
        d = self.discovery
        file = Path(d.files[int(d.file_index[i])].path)
        reads.append(f"{file.parent.name}/{file.name}:{int(d.row_group[i])}")
        return real(self, i)

    monkeypatch.setattr(_read.FragmentReader, "read", read)
    return reads


def test_statistics_spare_the_reads_of_row_groups_ruled_out(
        path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = _spy_reads(monkeypatch)
    ds = pqloader.ParquetDataset(path, filter=(pc.field("id") >= 950) | (pc.field("id") < 20))
    assert reads == ["ds/part-00000.parquet:0", "ds/part-00003.parquet:0"]  # ids sorted
    assert _ids(ds) == [*range(20), *range(950, 1000)]


def test_without_statistics_every_row_group_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = np.arange(300)
    pq.write_table(pa.table({"id": ids}), tmp_path / "a.parquet", row_group_size=100,
                   write_statistics=False)
    reads = _spy_reads(monkeypatch)
    ds = pqloader.ParquetDataset(tmp_path, filter=pc.field("id") >= 250)
    assert reads == [f"{tmp_path.name}/a.parquet:{i}" for i in range(3)]
    assert _ids(ds) == list(range(250, 300))


def test_a_files_folders_rule_out_its_row_groups(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for split in ("test", "train"):
        (tmp_path / f"split={split}").mkdir()
        pq.write_table(pa.table({"id": np.arange(200) + (0 if split == "test" else 1000)}),
                       tmp_path / f"split={split}" / "part.parquet", row_group_size=100)
    reads = _spy_reads(monkeypatch)
    ds = pqloader.ParquetDataset(tmp_path, filter=(pc.field("split") == "train") &
                                 (pc.bit_wise_and(pc.field("id"), 1) == 0))
    assert reads == ["split=train/part.parquet:0", "split=train/part.parquet:1"]
    assert _ids(ds) == list(range(1000, 1200, 2))


def test_a_column_named_by_position_is_refused(path: Path) -> None:
    with pytest.raises(pqloader.InvalidArgumentError, match=r"by its position; name it"):
        pqloader.ParquetDataset(path, filter=pc.field(0) < 10)


def test_resume_states_tell_filters_apart_that_print_alike(path: Path) -> None:
    """pyarrow prints 20 values of an isin, and no literal's unit: the state keeps it all."""
    # str() shows the set's first 10 values and its last 10: these sets differ in between
    a = [*range(10), *range(10, 990, 2), *range(990, 1000)]
    b = [*range(10), *range(11, 990, 2), *range(990, 1000)]
    assert str(pc.field("id").isin(a)) == str(pc.field("id").isin(b))
    saved = pqloader.DataLoader(pqloader.ParquetDataset(path, filter=pc.field("id").isin(a)),
                                batch_size=16)
    next(iter(saved))
    state = saved.state_dict()
    other = pqloader.DataLoader(pqloader.ParquetDataset(path, filter=pc.field("id").isin(b)),
                                batch_size=16)
    with pytest.raises(pqloader.StateMismatchError):
        other.load_state_dict(state)
    same = pqloader.DataLoader(pqloader.ParquetDataset(path, filter=pc.field("id").isin(a)),
                               batch_size=16)
    same.load_state_dict(state)


def test_nan_rows_a_filter_keeps_are_not_pruned(tmp_path: Path) -> None:
    """Parquet's min/max leave NaN out; pruning by them lost the NaN rows (pyarrow's own
    filtered read loses them too, so the oracle here is the table filtered in memory)."""
    table = pa.table({"id": [0, 1, 2, 3], "x": [0.1, 0.2, float("nan"), 0.3]})
    pq.write_table(table, tmp_path / "a.parquet")
    for keep in (~(pc.field("x") <= 0.5), pc.field("x").is_nan()):
        ds = pqloader.ParquetDataset(tmp_path, filter=keep)
        assert _ids(ds) == table.filter(keep)["id"].to_pylist() == [2]


@pytest.mark.parametrize(("dnf", "pruned"), [
    ([("x", ">", 0.75)], True),  # NaN > 0.75 is false: its rows were never kept
    ([[("x", "<", 0.1)], [("x", ">=", 0.9), ("id", "!=", 5)]], True),
    ([("x", "in", [0.95, 0.97])], True),
    ([("x", "!=", 0.5)], False),  # true on NaN: rows in any row group
    ([("x", "not in", [0.5])], False),
    ([("x", "in", [float("nan"), 0.95])], False),
])
def test_dnf_filters_false_on_nan_prune_float_row_groups(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dnf: list[Any], pruned: bool) -> None:
    """Filters as tuples: comparisons are false on NaN, so min/max (which leave NaN out) can
    rule row groups out, as they do for integers; a test true on NaN reads them all."""
    x = np.arange(400) / 400  # 0.95 is row 380
    x[[50, 150, 250, 350]] = np.nan  # one in each row group
    table = pa.table({"id": np.arange(400), "x": x})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=100)
    reads = _spy_reads(monkeypatch)
    ds = pqloader.ParquetDataset(tmp_path, filter=dnf)
    assert (len(reads) < 4) == pruned, reads
    assert _ids(ds) == table.filter(pq.filters_to_expression(dnf))["id"].to_pylist()


@pytest.mark.parametrize("zeros", [[0.0, 0.0, 0.0], [-0.0, -0.0, -0.0], [0.0, -0.0, 0.0]])
@pytest.mark.parametrize("values", [[0.0, 1.0], [-0.0, 1.0], [-0.5, 0.0, 1.0], [0, 1]])
def test_an_in_set_of_floats_with_a_zero_keeps_row_groups_of_zeros(
        tmp_path: Path, zeros: list[float], values: list[float]) -> None:
    """Statistics write a row group of zeros as min -0.0, max +0.0; pyarrow took it for -0.0
    alone, which ``is_in`` (by bits) does not find in {0.0}: the row group was ruled out and
    its rows lost (found by a filter fuzzer; pyarrow's own filtered read loses them too, so
    the oracle is the table filtered in memory)."""
    table = pa.table({"id": [0, 1, 2, 3], "x": [*zeros, 1.0]})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=3)
    dnf = [("x", "in", values)]
    ds = pqloader.ParquetDataset(tmp_path, filter=dnf)
    assert _ids(ds) == table.filter(pq.filters_to_expression(dnf))["id"].to_pylist()


def test_counting_in_small_pieces_counts_the_same(path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from pqloader import _kept

    keep = (pc.field("label") == 3) | (pc.field("id") > 900)
    monkeypatch.setattr(_kept, "_CHUNK_BYTES", 1)  # every row group tested on its own
    assert _ids(pqloader.ParquetDataset(path, filter=keep)) == _oracle(path, keep)


def test_a_filter_column_the_first_file_lacks_is_named_so(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": [1]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [2], "extra": [3]}), tmp_path / "b.parquet")
    with pytest.raises(pqloader.ColumnNotFoundError, match=r"reads column 'extra', which "
                       r".*a\.parquet \(the first file\) does not have"):
        pqloader.ParquetDataset(tmp_path, columns=["id"], filter=pc.field("extra") > 0)


def test_a_filter_does_not_hide_the_row_groups_a_budget_must_hold(tmp_path: Path) -> None:
    """A read decodes the whole row group before the filter keeps 1 row in 128: the budget's
    check took the kept share, and the loader ran at 2x its budget."""
    from pqloader._memory import RESERVE_BYTES

    n = 200_000  # one row group of ~13 MiB decoded
    table = pa.table({"id": np.arange(n), **{f"f{i}": np.ones(n, np.float32) for i in range(16)}})
    pqloader.write_dataset(table, tmp_path / "ds", row_group_size=n)
    budget = RESERVE_BYTES + 40 * 2**20  # room for small windows, not for 2 x 5 row groups
    for kept in (None, pc.bit_wise_and(pc.field("id"), 127) == 0):
        ds = pqloader.ParquetDataset(tmp_path / "ds", filter=kept)
        with pytest.raises(pqloader.InvalidArgumentError, match=r"row group \(1[34],"):
            pqloader.DataLoader(ds, batch_size=64, num_workers=2, memory_budget_bytes=budget)


def test_a_filter_sees_the_dataset_types_when_reading_as_when_counting(tmp_path: Path) -> None:
    """Files in ns and in us make one ns column: a filter on its integers kept other rows at
    the read (the file's us) than at the count (ns), and the read failed as a changed file."""
    import datetime as dt

    days = [dt.datetime(2024, 1, 1) + dt.timedelta(days=i) for i in range(10)]
    pq.write_table(pa.table({"id": range(10), "ts": pa.array(days, pa.timestamp("ns"))}),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": range(10, 20), "ts": pa.array(days, pa.timestamp("us"))}),
                   tmp_path / "b.parquet")
    day5 = int(pa.scalar(days[5], pa.timestamp("ns")).cast(pa.int64()).as_py())
    ds = pqloader.ParquetDataset(tmp_path, filter=pc.field("ts").cast(pa.int64()) >= day5)
    assert ds.columns["ts"] == pa.timestamp("ns")
    assert sorted(r["id"] for r in ds.__getitems__(range(len(ds)))) == [5, 6, 7, 8, 9, 15, 16,
                                                                        17, 18, 19]
    loader = pqloader.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2)
    assert sorted(int(i) for b in loader for i in b["id"]) == [5, 6, 7, 8, 9, 15, 16, 17, 18, 19]


def test_the_budget_holds_the_columns_a_filter_reads_beyond_the_projection(
        tmp_path: Path) -> None:
    """columns=["id"] with a filter over 32 float columns: a read decodes them all, and the
    check counted the id alone."""
    from pqloader._memory import RESERVE_BYTES

    n = 200_000
    table = pa.table({"id": np.arange(n), **{f"f{i}": np.ones(n, np.float32) for i in range(32)}})
    pqloader.write_dataset(table, tmp_path / "ds", row_group_size=n)
    wide = pc.bit_wise_and(pc.field("id"), 127) == 0
    for name in ("f0", "f31"):
        wide = wide & (pc.field(name) > 0)
    budget = RESERVE_BYTES + 16 * 2**20
    for columns in (None, ["id"]):
        ds = pqloader.ParquetDataset(tmp_path / "ds", columns=columns, filter=wide)
        with pytest.raises(pqloader.InvalidArgumentError, match="memory_budget_bytes"):
            pqloader.DataLoader(ds, batch_size=64, num_workers=2, memory_budget_bytes=budget)


def test_a_tiny_row_group_does_not_shrink_a_budget_window() -> None:
    """Its footer's fixed costs make its one row look 4.5x heavier than the others: sized for
    the heaviest row group, every window shrank 4.5x; it holds a row of a window, no more."""
    from pqloader._config import heaviest_rows

    rows = np.array([100_000] * 10 + [1])
    sizes = np.array([1_900_000] * 10 + [87])
    assert heaviest_rows(rows, sizes, 10_000_000) == 1 + (10_000_000 - 87) // 19
    assert heaviest_rows(rows, sizes, 10**9) is None  # every row fits
    heavy = np.array([1_000_000, 128, 128, 128])  # labels, then 3 row groups of long texts
    heavy_sizes = np.array([20_000_000, 2**21, 2**21, 2**21])
    assert heaviest_rows(heavy, heavy_sizes, 3 * 2**20) == 128 + 64
