"""A column of numbers typed differently across files is read in the type that holds both."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

import pqloader
from pqloader._widen import common_number, widened_bytes


@pytest.mark.parametrize(("a", "b", "common"), [
    (pa.int32(), pa.int64(), pa.int64()),
    (pa.int8(), pa.int16(), pa.int16()),
    (pa.uint8(), pa.uint32(), pa.uint32()),
    (pa.uint32(), pa.int32(), pa.int64()),
    (pa.uint8(), pa.int8(), pa.int16()),
    (pa.uint16(), pa.int64(), pa.int64()),
    (pa.float32(), pa.float64(), pa.float64()),
    (pa.float16(), pa.float32(), pa.float32()),
    (pa.int64(), pa.float64(), pa.float64()),
    (pa.int8(), pa.float32(), pa.float64()),
    (pa.int64(), pa.int64(), pa.int64()),
    (pa.uint64(), pa.int64(), None),  # no type holds both
    (pa.uint64(), pa.int8(), None),
    (pa.bool_(), pa.int8(), None),
    (pa.string(), pa.int64(), None),
    (pa.decimal128(10, 2), pa.float64(), None),
    (pa.date32(), pa.int32(), None),
    (pa.string(), pa.string(), None),  # not numbers
])
def test_common_number(a: pa.DataType, b: pa.DataType, common: pa.DataType | None) -> None:
    assert common_number(a, b) == common
    assert common_number(b, a) == common


def test_widened_bytes_follow_what_the_footer_estimates() -> None:
    assert widened_bytes(pa.int64(), pa.int32()) == 2.0
    assert widened_bytes(pa.int16(), pa.int8()) == 1.0  # stored in 4 bytes: estimated so
    assert widened_bytes(pa.float32(), pa.float16()) == 2.0
    assert widened_bytes(pa.float64(), pa.int64()) == 1.0
    assert widened_bytes(pa.list_(pa.int64()), pa.list_(pa.int32())) == 2.0
    assert widened_bytes(pa.string(), pa.large_string()) == 1.0


def _shards(root: Path, *tables: pa.Table) -> Path:
    root.mkdir()
    for k, table in enumerate(tables):
        pq.write_table(table, root / f"part-{k}.parquet")
    return root


def test_a_pandas_shard_whose_ints_became_floats_reads_as_floats(tmp_path: Path) -> None:
    """pandas writes an int column as float64 in a shard where it has a missing value: the
    dataset was refused ("is int64 in a but double in b")."""
    root = _shards(tmp_path / "ds",
                   pa.table({"id": np.arange(100), "age": np.arange(100)}),
                   pa.table({"id": np.arange(100, 200),
                             "age": [np.nan, *np.arange(1.0, 100.0)]}))
    ds = pqloader.ParquetDataset(root)
    assert ds.columns["age"] == pa.float64()
    ages = {}
    for batch in pqloader.DataLoader(ds, batch_size=64, shuffle=True, seed=0, num_workers=2):
        assert batch["age"].dtype == torch.float64
        ages.update(zip(batch["id"].tolist(), batch["age"].tolist(), strict=True))
    assert len(ages) == 200 and np.isnan(ages[100])
    assert all(ages[i] == i for i in range(100))
    assert all(ages[i] == i - 100 for i in range(101, 200))
    assert ds[150]["age"] == 50.0
    # a filter is bound to the dataset's types: is_nan has no kernel for the first file's ints
    nan = pqloader.ParquetDataset(root, filter=pc.is_nan(pc.field("age")))
    assert [b["id"].tolist() for b in pqloader.DataLoader(nan, batch_size=8)] == [[100]]


def test_a_schema_grown_from_int_to_bigint_reads_as_bigint(tmp_path: Path) -> None:
    """Spark's int column made bigint: old files hold int32, new ones int64 (lists too)."""
    root = _shards(tmp_path / "ds",
                   pa.table({"n": pa.array([1, 2], pa.int32()),
                             "u": pa.array([1, 2], pa.uint32()),
                             "f": pa.array([0.5, 1.5], pa.float32()),
                             "tokens": pa.array([[1], [2, 3]], pa.list_(pa.int32()))}),
                   pa.table({"n": pa.array([2**40, 4], pa.int64()),
                             "u": pa.array([-1, 2**31 - 1], pa.int32()),
                             "f": pa.array([0.1, 2.5], pa.float64()),
                             "tokens": pa.array([[2**40], []], pa.list_(pa.int64()))}))
    ds = pqloader.ParquetDataset(root)
    assert ds.columns == {"n": pa.int64(), "u": pa.int64(), "f": pa.float64(),
                          "tokens": pa.list_(pa.int64())}
    (batch,) = pqloader.DataLoader(ds, batch_size=4)
    assert batch["n"].tolist() == [1, 2, 2**40, 4]
    assert batch["u"].tolist() == [1, 2, -1, 2**31 - 1]
    assert batch["f"].tolist() == [0.5, 1.5, 0.1, 2.5]
    assert batch["tokens"].dtype == torch.int64 and batch["tokens"][2, 0] == 2**40
    # windows are sized by what the rows take once widened: the int32 file's n takes 8 bytes
    d = ds._discovery
    narrow, wide = (pq.read_table(f).cast(ds.schema).nbytes for f in sorted(root.iterdir()))
    assert d.byte_size[0] >= 0.9 * narrow and d.byte_size[1] >= 0.9 * wide


def test_values_the_wider_type_would_change_are_an_error_naming_them(tmp_path: Path) -> None:
    root = _shards(tmp_path / "ds", pa.table({"x": [0.5]}),
                   pa.table({"x": pa.array([2**53 + 1], pa.int64())}))
    ds = pqloader.ParquetDataset(root)
    with pytest.raises(pqloader.DataError,
                       match=r"part-1\.parquet: row group 0, column 'x': its int64 values do "
                             r"not fit the dataset's double"):
        list(pqloader.DataLoader(ds, batch_size=4))


@pytest.mark.parametrize("first", [pa.array([1], pa.uint64()), pa.array([True]),
                                   pa.array(["1"])])
def test_numbers_no_type_holds_together_are_still_refused(tmp_path: Path,
                                                          first: pa.Array) -> None:
    root = _shards(tmp_path / "ds", pa.table({"x": first}),
                   pa.table({"x": pa.array([1], pa.int64())}))
    with pytest.raises(pqloader.SchemaMismatchError, match=r"column 'x' is .* but .* in"):
        pqloader.ParquetDataset(root)


def test_widened_sizes_hold_beside_measured_strings(tmp_path: Path) -> None:
    """Measuring a dataset's dictionary-encoded strings sized its row groups anew from the
    footers, the widening forgotten: an int32 file read as int64 was sized 0.54x (review)."""
    names = pa.array(["alpha", "beta", "gamma"]).take(np.arange(5000) % 3)
    ints = {f"c{k}": np.arange(5000) for k in range(8)}
    root = _shards(tmp_path / "ds",
                   pa.table({**{c: pa.array(v, pa.int32()) for c, v in ints.items()},
                             "name": names}),
                   pa.table({**{c: pa.array(v, pa.int64()) for c, v in ints.items()},
                             "name": names}))
    ds = pqloader.ParquetDataset(root)
    for fragment, f in enumerate(sorted(root.iterdir())):
        decoded = pq.read_table(f).cast(ds.schema).nbytes
        assert 0.9 < ds._discovery.byte_size[fragment] / decoded < 1.1, f.name


@pytest.mark.parametrize(("dataset", "file", "fit"), [
    (pa.int64(), pa.int32(), True),
    (pa.int64(), pa.float64(), False),
    (pa.list_(pa.int64()), pa.list_(pa.float64()), False),
    (pa.list_(pa.int64()), pa.large_list(pa.int32()), True),
    (pa.struct({"a": pa.int32()}), pa.struct({"a": pa.int64()}), False),
    (pa.map_(pa.string(), pa.float64()), pa.map_(pa.string(), pa.float32()), True),
    (pa.string(), pa.large_string(), True),  # not numbers: same_type's concern
])
def test_fits(dataset: pa.DataType, file: pa.DataType, fit: bool) -> None:
    from pqloader._widen import fits

    assert fits(dataset, file) is fit


def test_a_file_rewritten_under_its_manifest_with_wider_numbers_is_refused(
        tmp_path: Path) -> None:
    """list<double> where the manifest said list<int64> was cast down silently (review)."""
    from pqloader._read import FragmentReader

    root = tmp_path / "ds"
    pqloader.write_dataset(pa.table({"a": [[1, 2], [3]] * 50}), root, rows_per_file=50)
    ds = pqloader.ParquetDataset(root)  # from the manifest: no footer read
    shard = sorted(root.glob("part-*.parquet"))[1]
    pq.write_table(pa.table({"a": pa.array([[1.5]] * 50, pa.list_(pa.float64()))}), shard)
    reader = FragmentReader(ds._discovery)
    with pytest.raises(pqloader.SchemaMismatchError, match=r"column 'a' is list<.*double>"):
        reader._check_types(ds._discovery.files[1], pq.read_metadata(shard))


@pytest.mark.parametrize("first", [pa.float16(), pa.null()])
def test_a_filter_is_checked_against_the_unified_type_whatever_the_files_order(
        tmp_path: Path, first: pa.DataType) -> None:
    """float16 in the first file, float32 in the next: x > 1 was refused (no float16 kernel),
    and opened with the files the other way round (found in review)."""
    x = pa.array([0.5, 2.0], first) if first != pa.null() else pa.nulls(2)
    root = _shards(tmp_path / "ds", pa.table({"x": x}),
                   pa.table({"x": pa.array([0.5, 2.0], pa.float16())}),
                   pa.table({"x": pa.array([0.5, 3.0], pa.float32())}))
    ds = pqloader.ParquetDataset(root, filter=[("x", ">", 1)])
    assert len(ds) == (3 if first != pa.null() else 2)


def test_widened_structs_and_maps_are_sized_as_read(tmp_path: Path) -> None:
    """widened_bytes looked inside lists only: a struct of int32 read as int64 was sized 0.5x."""
    n = 5000
    def table(t: pa.DataType) -> pa.Table:
        return pa.table({"s": pa.StructArray.from_arrays(
            [pa.array(np.arange(n), t), pa.array(np.arange(n), t)], ["a", "b"])})
    root = _shards(tmp_path / "ds", table(pa.int32()), table(pa.int64()))
    ds = pqloader.ParquetDataset(root)
    for fragment, f in enumerate(sorted(root.iterdir())):
        decoded = pq.read_table(f).cast(ds.schema).nbytes
        assert ds._discovery.byte_size[fragment] >= 0.9 * decoded, f.name
    assert widened_bytes(pa.map_(pa.string(), pa.int64()), pa.map_(pa.string(), pa.int32())) \
        == 2.0
