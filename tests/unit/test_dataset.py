"""ParquetDataset: structure, projection, map-style access, layouts, and torch samplers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.utils.data

import pqloader


@pytest.fixture
def dataset_path(make_dataset: Any) -> Path:
    """1000 rows in 4 files (300, 300, 300, 100 rows) of row groups of 100 rows."""
    return make_dataset(1000)


def _expected_row(i: int) -> dict[str, Any]:
    return {"id": i, "tokens": list(range(i % 5)), "text": f"row {i}"}


# -- structure ------------------------------------------------------------------------------------
def test_structure(dataset_path: Path) -> None:
    ds = pqloader.ParquetDataset(dataset_path)
    assert len(ds) == 1000
    assert ds.files == [str(dataset_path / f"part-{i:05d}.parquet") for i in range(4)]
    assert ds.num_row_groups == 10
    assert ds.fragment_rows.tolist() == [100] * 10
    assert list(ds.columns) == ["id", "x", "tokens", "text"]
    assert ds.columns["id"] == pa.int64()
    assert ds.columns["x"] == pa.float32()
    assert pa.types.is_list(ds.columns["tokens"])
    assert ds.columns["tokens"].value_type == pa.int32()
    assert ds.columns["text"] == pa.string()
    assert isinstance(ds.schema, pa.Schema)
    assert ds.schema.names == ["id", "x", "tokens", "text"]
    assert [ds.schema.field(n).type for n in ds.schema.names] == list(ds.columns.values())


def test_repr(dataset_path: Path) -> None:
    text = repr(pqloader.ParquetDataset(dataset_path))
    assert text.startswith("ParquetDataset(")
    for part in ("1,000 rows", "4 files", "10 row groups", "id: int64", "x: float", "text:"):
        assert part in text


def test_fragment_rows_is_read_only(dataset_path: Path) -> None:
    ds = pqloader.ParquetDataset(dataset_path)
    with pytest.raises(ValueError):
        ds.fragment_rows[0] = 5
    assert len(ds) == 1000


def test_repr_of_a_wide_table_names_30_columns_of_5000(tmp_path: Path) -> None:
    pqloader.write_dataset(pa.table({f"c{i}": [i] for i in range(5_000)}), tmp_path)
    text = repr(pqloader.ParquetDataset(tmp_path))
    assert "c29: int64, ... (4,970 more: ds.columns))" in text and len(text) < 1_000


def test_columns_projection_and_order(dataset_path: Path) -> None:
    ds = pqloader.ParquetDataset(dataset_path, columns=["text", "id"])
    assert list(ds.columns) == ["text", "id"]
    assert ds.schema.names == ["text", "id"]
    assert list(ds[7]) == ["text", "id"]
    assert ds[7] == {"text": "row 7", "id": 7}
    batch = next(iter(pqloader.DataLoader(ds, batch_size=4, num_workers=0)))
    assert list(batch) == ["text", "id"]


def test_projected_columns_of_files_in_other_orders_and_nested(tmp_path: Path) -> None:
    """Row groups are read by leaf column index (no map of names by path at each open):
    the leaves differ per file when its columns come in another order or are nested."""
    import pyarrow.parquet as pq

    point = pa.struct([("x", pa.int64()), ("y", pa.float64())])
    first = pa.table({"id": [0, 1], "p": pa.array([{"x": 1, "y": 0.5}, None], point),
                      "tags": pa.array([[1], [2, 3]]), "skip": ["a", "b"]})
    second = pa.table({"skip": ["c"], "tags": pa.array([[4]]), "id": [2],
                       "p": pa.array([{"x": 3, "y": 1.5}], point)})
    pq.write_table(first, tmp_path / "a.parquet")
    pq.write_table(second, tmp_path / "b.parquet")
    ds = pqloader.ParquetDataset(tmp_path, columns=["tags", "p", "id"])
    got = pa.concat_tables(ds.reader.read(f) for f in range(ds.num_row_groups))
    assert got.to_pylist() == [
        {"tags": [1], "p": {"x": 1, "y": 0.5}, "id": 0}, {"tags": [2, 3], "p": None, "id": 1},
        {"tags": [4], "p": {"x": 3, "y": 1.5}, "id": 2}]


def test_columns_must_be_a_list(dataset_path: Path) -> None:
    with pytest.raises(pqloader.InvalidArgumentError, match="columns"):
        pqloader.ParquetDataset(dataset_path, columns="id")  # type: ignore[arg-type]


def test_columns_named_twice(dataset_path: Path) -> None:
    with pytest.raises(pqloader.ColumnNotFoundError, match="twice"):
        pqloader.ParquetDataset(dataset_path, columns=["id", "id"])


# -- map-style access -----------------------------------------------------------------------------
def test_getitem(dataset_path: Path) -> None:
    ds = pqloader.ParquetDataset(dataset_path, columns=["id", "tokens", "text"])
    for i in (0, 1, 99, 100, 299, 300, 555, 999):
        assert ds[i] == _expected_row(i)
    assert ds[np.int64(42)] == _expected_row(42)
    x = pqloader.ParquetDataset(dataset_path, columns=["x"])[3]["x"]
    assert isinstance(x, float)


def test_getitem_negative(dataset_path: Path) -> None:
    ds = pqloader.ParquetDataset(dataset_path, columns=["id"])
    assert ds[-1] == {"id": 999}
    assert ds[-1000] == {"id": 0}
    assert ds[-301] == {"id": 699}


@pytest.mark.parametrize("index", [1000, 5000, -1001, -1500, -2000, -5000])
def test_getitem_out_of_range(dataset_path: Path, index: int) -> None:
    ds = pqloader.ParquetDataset(dataset_path, columns=["id"])
    with pytest.raises(IndexError) as info:
        ds[index]
    assert str(index) in str(info.value)  # the message names the row asked for
    with pytest.raises(IndexError):
        ds.__getitems__([0, index])


def test_getitem_rejects_non_int(dataset_path: Path) -> None:
    ds = pqloader.ParquetDataset(dataset_path, columns=["id"])
    with pytest.raises(TypeError):
        ds[1.5]  # type: ignore[index]
    with pytest.raises(TypeError):
        ds["id"]  # type: ignore[index]


@pytest.mark.parametrize("indices", [[1.9, "3"], [True, False], np.array([1.0, 2.0]),
                                     np.array([True]), [1, None], ["3"]])
def test_getitems_takes_only_ints(dataset_path: Path, indices: Any) -> None:
    ds = pqloader.ParquetDataset(dataset_path, columns=["id"])
    with pytest.raises(TypeError, match=r"not an int.*1000 rows"):
        ds.__getitems__(indices)


@pytest.mark.parametrize("indices", [np.array([[1, 2], [3, 4]]), [[1], [2, 3]], 5])
def test_getitems_takes_a_flat_sequence(dataset_path: Path, indices: Any) -> None:
    ds = pqloader.ParquetDataset(dataset_path, columns=["id"])
    with pytest.raises(TypeError, match="indices must be a"):
        ds.__getitems__(indices)


@pytest.mark.parametrize("index", [2**64 - 1, 2**63, 2**70, -(2**70)])
def test_huge_indices_are_out_of_range_and_named(dataset_path: Path, index: int) -> None:
    ds = pqloader.ParquetDataset(dataset_path, columns=["id"])
    message = f"row {index} is out of range for 1000 rows"
    with pytest.raises(IndexError, match=message):
        ds.__getitems__([1, index])
    with pytest.raises(IndexError, match=message):
        ds[index]
    if 0 <= index < 2**64:
        with pytest.raises(IndexError, match=message):  # not wrapped to a negative number
            ds.__getitems__(np.array([index], dtype=np.uint64))


@pytest.mark.parametrize("indices", [np.array([5, 3], np.uint8), np.array([5, -997], np.int16),
                                     torch.tensor([5, 3]), (np.int32(5), 3),
                                     [np.int64(5), np.uint64(3)]])
def test_getitems_takes_any_integer_dtype(dataset_path: Path, indices: Any) -> None:
    ds = pqloader.ParquetDataset(dataset_path, columns=["id"])
    assert ds.__getitems__(indices) == [{"id": 5}, {"id": 3}]


def test_a_bool_is_not_an_index(dataset_path: Path) -> None:
    ds = pqloader.ParquetDataset(dataset_path, columns=["id"])
    with pytest.raises(TypeError, match="bool"):
        ds[True]  # type: ignore[index]
    for flag in (torch.tensor(True), np.array(True), torch.tensor(1.5)):
        with pytest.raises(TypeError, match="index must be an int"):
            ds[flag]  # type: ignore[index]


def test_a_slice_gives_its_rows(dataset_path: Path) -> None:
    """ds[0:2] was refused, pointing at a dunder method (found in review)."""
    ds = pqloader.ParquetDataset(dataset_path, columns=["id"])
    assert ds[3:6] == [{"id": 3}, {"id": 4}, {"id": 5}]
    assert ds[-2:] == [{"id": len(ds) - 2}, {"id": len(ds) - 1}]
    assert ds[10:4:-3] == [{"id": 10}, {"id": 7}]
    assert ds[5:5] == []


def test_a_missing_column_names_the_hive_columns_and_a_close_one(tmp_path: Path) -> None:
    """A misspelled column was told among the file's columns only, without the hive folders'
    (found in review)."""
    folder = tmp_path / "year=2023"
    folder.mkdir()
    pq.write_table(pa.table({"x": [1]}), folder / "p.parquet")
    with pytest.raises(pqloader.ColumnNotFoundError,
                       match=r"\['x'\] and its hive folders' \['year'\]: did you mean 'year'"):
        pqloader.ParquetDataset(tmp_path, columns=["yeer"])


def test_an_index_may_be_a_0d_tensor_or_array(dataset_path: Path) -> None:
    """torch's Subset and SubsetRandomSampler over a tensor of indices pass 0-d tensors: they
    were refused ("index must be an int, got Tensor") while __getitems__ took them."""
    ds = pqloader.ParquetDataset(dataset_path, columns=["id"])
    assert ds[torch.tensor(5)] == ds[np.array(5)] == ds[np.int8(5)] == {"id": 5}
    assert torch.utils.data.Subset(ds, torch.arange(7, 9))[1] == {"id": 8}
    sampler = torch.utils.data.SubsetRandomSampler(torch.arange(10, 20))
    rows = [r["id"] for r in torch.utils.data.DataLoader(ds, batch_size=None, sampler=sampler)]
    assert sorted(int(r) for r in rows) == list(range(10, 20))


@pytest.mark.parametrize("indices", [{1, 2}, (i for i in range(2))])
def test_a_set_or_generator_of_indices_is_named(dataset_path: Path, indices: Any) -> None:
    ds = pqloader.ParquetDataset(dataset_path, columns=["id"])
    kind = type(indices).__name__
    with pytest.raises(TypeError, match=f"got a {kind} \\(pass a list\\)"):
        ds.__getitems__(indices)


def test_getitems_in_asked_order(dataset_path: Path) -> None:
    ds = pqloader.ParquetDataset(dataset_path, columns=["id", "tokens", "text"])
    indices = [999, 0, 555, 101, 100, 555, -2, 300, 7]
    rows = ds.__getitems__(indices)
    assert rows == [_expected_row(i % 1000) for i in indices]
    assert ds.__getitems__([]) == []
    assert ds.__getitems__(np.array([5, 3])) == [_expected_row(5), _expected_row(3)]


def test_getitems_random_access_matches_table(dataset_path: Path) -> None:
    ds = pqloader.ParquetDataset(dataset_path)
    table = pq.read_table(dataset_path)
    rng = np.random.default_rng(0)
    indices = rng.integers(0, 1000, size=300).tolist()
    assert ds.__getitems__(indices) == table.take(indices).to_pylist()


def test_dataset_pickles(dataset_path: Path) -> None:
    import pickle

    ds = pqloader.ParquetDataset(dataset_path, columns=["id", "text"])
    ds[5]  # warm the row-group cache, which must not travel
    copy = pickle.loads(pickle.dumps(ds))
    assert len(copy) == 1000
    assert copy.columns == ds.columns
    assert copy[-1] == {"id": 999, "text": "row 999"}


def test_to_torch_and_a_loader_whose_persistent_workers_ran_pickle(dataset_path: Path) -> None:
    """Only while a process spawned: a RawArray, a running torch loader (found in review)."""
    import copy
    import pickle

    ds = pqloader.ParquetDataset(dataset_path, columns=["id"])
    it = ds.to_torch(batch_size=100, shuffle=True)
    it.set_epoch(3, start=2, num_workers=1)
    for twin in (pickle.loads(pickle.dumps(it)), copy.deepcopy(it)):
        twin_ids = [int(i) for b in twin for i in b["id"]]
        assert twin_ids == [int(i) for b in it for i in b["id"]]  # the same place, epoch 3
        assert len(twin_ids) == 800
        twin.set_epoch(4)  # a cursor of its own
        assert len([b for b in it]) == 8
    loader = pqloader.DataLoader(ds, batch_size=100, num_workers=1, worker_type="process",
                                 persistent_workers=True)
    assert len(list(loader)) == 10
    again = pickle.loads(pickle.dumps(loader))
    assert sorted(int(i) for b in again for i in b["id"]) == list(range(1000))


# -- layouts --------------------------------------------------------------------------------------
def test_spark_layout(tmp_path: Path) -> None:
    root = tmp_path / "spark"
    root.mkdir()
    for i in range(3):
        name = f"part-{i:05d}-3f2a9c1e-c000.snappy.parquet"
        ids = np.arange(i * 10, i * 10 + 10)
        pq.write_table(pa.table({"id": ids}), root / name)
        (root / f".{name}.crc").write_bytes(b"\x00crc\x01")
    (root / "_SUCCESS").touch()
    (root / "._SUCCESS.crc").write_bytes(b"crc")
    (root / "_committed_123").write_text("{}")
    ds = pqloader.ParquetDataset(root)
    assert len(ds) == 30
    assert len(ds.files) == 3
    assert all(Path(f).name.startswith("part-") for f in ds.files)
    assert [r["id"] for r in ds.__getitems__(range(30))] == list(range(30))


def test_hidden_directories_are_skipped(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "_temporary" / "0").mkdir(parents=True)
    (root / ".staging").mkdir()
    pq.write_table(pa.table({"id": [1, 2]}), root / "part-0.parquet")
    (root / "_temporary" / "0" / "part-junk.parquet").write_text("half written")
    (root / ".staging" / "part-junk.parquet").write_text("half written")
    assert len(pqloader.ParquetDataset(root)) == 2


def _write_hive(root: Path) -> None:
    rows = 0
    for year in (2020, 2021):
        for country in ("007", "fr", "us"):  # the order folders are walked in
            folder = root / f"year={year}" / f"country={country}"
            folder.mkdir(parents=True)
            pq.write_table(pa.table({"id": np.arange(rows, rows + 4)}), folder / "part-0.parquet")
            rows += 4


def test_hive_partitions(tmp_path: Path) -> None:
    _write_hive(tmp_path)
    ds = pqloader.ParquetDataset(tmp_path)
    assert ds.columns == {"id": pa.int64(), "year": pa.int64(), "country": pa.string()}
    assert len(ds) == 24
    assert ds[0] == {"id": 0, "year": 2020, "country": "007"}  # '007' mixed with text: a string
    assert ds[23] == {"id": 23, "year": 2021, "country": "us"}
    batch = next(iter(pqloader.DataLoader(ds, batch_size=24, num_workers=0)))
    assert batch["year"].dtype == torch.int64
    assert batch["year"].tolist() == [2020] * 12 + [2021] * 12
    assert batch["country"][:12] == ["007"] * 4 + ["fr"] * 4 + ["us"] * 4


def test_hive_partitions_projection(tmp_path: Path) -> None:
    _write_hive(tmp_path)
    ds = pqloader.ParquetDataset(tmp_path, columns=["country", "id"])
    assert list(ds.columns) == ["country", "id"]
    assert ds[5] == {"country": "fr", "id": 5}
    only_partition = pqloader.ParquetDataset(tmp_path, columns=["year"])
    assert [r["year"] for r in only_partition.__getitems__([0, 23])] == [2020, 2021]


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        (["1", "-12", "0"], pa.int64()),
        (["1", "-12", "007"], pa.string()),  # an int would drop the zeros: text kept
        (["007", "7"], pa.string()),  # as ints, two folders were one value
        (["01", "12"], pa.string()),
        (["+5", "5"], pa.string()),
        (["-0", "1"], pa.string()),
        (["1", "__HIVE_DEFAULT_PARTITION__"], pa.int64()),  # a null partition
        (["1", "a"], pa.string()),
        (["1", "--5"], pa.string()),  # once taken for an int, then failed in int()
        (["1", "99999999999999999999"], pa.string()),  # beyond int64
        (["1", "\u00b2"], pa.string()),  # str.isdigit() says yes, int() says no
        (["1.5", "2"], pa.string()),
    ],
)
def test_hive_partition_types(tmp_path: Path, values: list[str], kind: pa.DataType) -> None:
    for i, value in enumerate(values):
        folder = tmp_path / f"k={value}"
        folder.mkdir()
        pq.write_table(pa.table({"id": [i]}), folder / "part-0.parquet")
    ds = pqloader.ParquetDataset(tmp_path)
    assert ds.columns["k"] == kind
    got = {r["id"]: r["k"] for r in ds.__getitems__(range(len(values)))}
    for i, value in enumerate(values):
        if value == "__HIVE_DEFAULT_PARTITION__":
            assert got[i] is None
        else:
            assert got[i] == (int(value) if kind == pa.int64() else value)


@pytest.mark.parametrize("second", ["more categories", "plain text"])
def test_pandas_categorical_shards_make_one_column(tmp_path: Path, second: str) -> None:
    """pandas writes a categorical's codes in 8 to 32 bits by the count of its categories, and
    a shard may hold the column as plain text: refused as two types (found in review)."""
    import pandas as pd

    cities = [f"c{i}" for i in range(300)]
    pd.DataFrame({"city": pd.Categorical(["paris", "rome"]), "y": [0, 1]}).to_parquet(
        tmp_path / "day1.parquet")
    other = pd.Categorical(cities) if second == "more categories" else cities
    pd.DataFrame({"city": other, "y": range(2, 302)}).to_parquet(tmp_path / "day2.parquet")
    ds = pqloader.ParquetDataset(tmp_path)
    want = {0: "paris", 1: "rome", **{i + 2: c for i, c in enumerate(cities)}}
    assert {r["y"]: r["city"] for r in ds.__getitems__(range(302))} == want
    got = {}
    for batch in pqloader.DataLoader(ds, batch_size=64, shuffle=True, num_workers=0):
        got.update(zip(batch["y"].tolist(), batch["city"], strict=True))
    assert got == want


def test_glob_source(dataset_path: Path) -> None:
    ds = pqloader.ParquetDataset(str(dataset_path / "part-0000[12].parquet"))
    assert len(ds) == 600
    assert ds[0]["id"] == 300
    everything = pqloader.ParquetDataset(str(dataset_path / "*.parquet"))
    assert len(everything) == 1000


def test_recursive_glob_source(tmp_path: Path) -> None:
    _write_hive(tmp_path)
    ds = pqloader.ParquetDataset(str(tmp_path / "**" / "*.parquet"))
    assert len(ds) == 24
    assert list(ds.columns) == ["id"]  # a glob has no root: no partition columns


def test_list_of_files(dataset_path: Path) -> None:
    files = [dataset_path / "part-00003.parquet", str(dataset_path / "part-00000.parquet")]
    ds = pqloader.ParquetDataset(files)
    assert len(ds) == 400
    assert ds[0]["id"] == 900  # the list's order, not sorted
    assert ds[100]["id"] == 0


def test_single_file_and_file_url(dataset_path: Path) -> None:
    path = dataset_path / "part-00001.parquet"
    assert len(pqloader.ParquetDataset(path)) == 300
    assert len(pqloader.ParquetDataset(f"file://{path}")) == 300


def test_remote_url_without_credentials_fails_at_once_naming_it(tmp_path: Path) -> None:
    pytest.importorskip("s3fs")
    options = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}  # nothing listens
    with pytest.raises(pqloader.PQLoaderError, match="s3://bucket/data"):
        pqloader.ParquetDataset("s3://bucket/data", storage_options=options,
                                retry=pqloader.RetryPolicy(attempts=2, base_delay_s=0.01))


def test_list_element_vs_item(tmp_path: Path) -> None:
    tokens = pa.array([[i] * (i % 3) for i in range(10)], pa.list_(pa.int32()))
    table = pa.table({"id": np.arange(10), "tokens": tokens})
    pq.write_table(table.slice(0, 5), tmp_path / "a.parquet", use_compliant_nested_type=True)
    pq.write_table(table.slice(5), tmp_path / "b.parquet", use_compliant_nested_type=False)
    names = {pq.read_schema(tmp_path / f).field("tokens").type.value_field.name
             for f in ("a.parquet", "b.parquet")}
    assert names == {"element", "item"}
    ds = pqloader.ParquetDataset(tmp_path)
    assert [r["tokens"] for r in ds.__getitems__(range(10))] == tokens.to_pylist()
    batches = list(pqloader.DataLoader(ds, batch_size=10, num_workers=0))
    assert batches[0]["tokens_lengths"].tolist() == [i % 3 for i in range(10)]


def test_spark_written_list_alongside_pyarrow(tmp_path: Path, make_dataset: Any) -> None:
    """The same dataset, two files re-written with the other list naming."""
    src = make_dataset(200, rows_per_file=100)
    dst = tmp_path / "mixed"
    shutil.copytree(src, dst)
    t = pq.read_table(dst / "part-00001.parquet")
    pq.write_table(t, dst / "part-00001.parquet", use_compliant_nested_type=False)
    (dst / "_pqloader_manifest.json").unlink()  # rewritten by hand: its footers are the truth
    ds = pqloader.ParquetDataset(dst)
    assert len(ds) == 200
    assert ds[150]["tokens"] == list(range(150 % 5))


# -- torch samplers -------------------------------------------------------------------------------
def test_sequential_sampler(dataset_path: Path) -> None:
    ds = pqloader.ParquetDataset(dataset_path)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=64, sampler=torch.utils.data.SequentialSampler(ds),
        collate_fn=lambda rows: torch.utils.data.default_collate(
            [{k: v for k, v in r.items() if k != "tokens"} for r in rows]),
    )
    batches = list(loader)
    assert len(batches) == len(loader) == 16
    ids = torch.cat([b["id"] for b in batches])
    assert ids.tolist() == list(range(1000))
    assert batches[0]["x"].shape == (64,)
    assert batches[0]["text"][:2] == ["row 0", "row 1"]


def test_default_collate_of_rows(dataset_path: Path) -> None:
    ds = pqloader.ParquetDataset(dataset_path, columns=["id", "x", "text"])
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=8)))
    assert batch["id"].tolist() == list(range(8))
    assert batch["id"].dtype == torch.int64
    assert batch["x"].shape == (8,)
    assert batch["text"] == [f"row {i}" for i in range(8)]


def test_weighted_random_sampler(dataset_path: Path) -> None:
    ds = pqloader.ParquetDataset(dataset_path, columns=["id", "x", "text"])
    weights = torch.zeros(len(ds), dtype=torch.float64)
    weights[100:200] = 1.0  # only rows 100..199 can be drawn
    sampler = torch.utils.data.WeightedRandomSampler(
        weights, num_samples=500, replacement=True, generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(ds, batch_size=50, sampler=sampler)
    batches = list(loader)
    assert len(batches) == 10
    ids = torch.cat([b["id"] for b in batches])
    assert len(ids) == 500
    assert ids.min() >= 100 and ids.max() < 200
    assert len(set(ids.tolist())) > 50  # really random, with replacement
    texts = [t for b in batches for t in b["text"]]
    assert texts == [f"row {i}" for i in ids.tolist()]  # each row is whole


def test_sampler_with_torch_workers(dataset_path: Path) -> None:
    ds = pqloader.ParquetDataset(dataset_path, columns=["id"])
    sampler = torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(ds, batch_size=100, sampler=sampler, num_workers=2)
    ids = torch.cat([b["id"] for b in loader])
    assert sorted(ids.tolist()) == list(range(1000))


def test_a_written_dataset_opens_from_its_manifest_without_footers(tmp_path: Path) -> None:
    table = pa.table({"id": np.arange(1000), "x": np.arange(1000, dtype=np.float32)})
    pqloader.write_dataset(table, tmp_path / "d", rows_per_file=300, row_group_size=100)
    assert (tmp_path / "d" / "_pqloader_manifest.json").is_file()
    ds = pqloader.ParquetDataset(tmp_path / "d")
    assert all(f.metadata is None for f in ds._discovery.files), "no footer was read"
    assert len(ds) == 1000 and ds.num_row_groups == 10 and ds.schema.equals(table.schema)
    assert ds[999] == {"id": 999, "x": 999.0}
    got = sorted(i for b in pqloader.DataLoader(ds, batch_size=64, shuffle=True)
                 for i in b["id"].tolist())
    assert got == list(range(1000))
    assert [md.num_rows for md in ds.metadata] == [300, 300, 300, 100]  # read on demand


def test_a_stale_manifest_is_ignored_with_a_warning(tmp_path: Path) -> None:
    pqloader.write_dataset(pa.table({"id": np.arange(100)}), tmp_path, rows_per_file=50)
    pq.write_table(pa.table({"id": np.arange(100, 120)}), tmp_path / "part-00002.parquet")
    with pytest.warns(UserWarning, match="does not match the files"):
        ds = pqloader.ParquetDataset(tmp_path)
    assert len(ds) == 120


def test_the_fingerprint_is_the_same_with_or_without_manifest(tmp_path: Path) -> None:
    pqloader.write_dataset(pa.table({"id": np.arange(100)}), tmp_path, rows_per_file=50)
    with_manifest = pqloader.DataLoader(pqloader.ParquetDataset(tmp_path), batch_size=10)
    state = with_manifest.state_dict()
    (tmp_path / "_pqloader_manifest.json").unlink()
    without = pqloader.DataLoader(pqloader.ParquetDataset(tmp_path), batch_size=10)
    without.load_state_dict(state)


def _decoded(path: Path, columns: list[str] | None = None) -> int:
    """What the dataset's row groups take once read into Arrow."""
    return sum(pq.ParquetFile(f).read_row_group(i, columns=columns).nbytes
               for f in sorted(path.glob("*.parquet"))
               for i in range(pq.ParquetFile(f).num_row_groups))


def test_window_sizes_come_from_decoded_bytes_with_or_without_manifest(tmp_path: Path) -> None:
    # Dictionary-encoded pages (the writers' default) make the footers' byte counts wrong:
    # random float32 values store a dictionary plus indices (more than decoded), repeated
    # tokens far less.
    rng = np.random.default_rng(0)
    lengths = rng.integers(32, 256, 2000)
    tokens = pa.ListArray.from_arrays(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
                                      pa.array(rng.integers(0, 1000, int(lengths.sum())),
                                               pa.int32()))
    table = pa.table({"x": rng.random(2000, dtype=np.float32), "tokens": tokens,
                      "label": rng.integers(0, 10, 2000)})
    pqloader.write_dataset(table, tmp_path, rows_per_file=1000, row_group_size=500)
    encoded = sum(pq.read_metadata(f).row_group(i).total_byte_size
                  for f in sorted(tmp_path.glob("*.parquet")) for i in range(2))
    decoded = _decoded(tmp_path)
    assert decoded > 1.5 * encoded  # the footers alone would count half the tokens' memory
    with_manifest = pqloader.ParquetDataset(tmp_path)._discovery.byte_size
    (tmp_path / "_pqloader_manifest.json").unlink()
    footers = pqloader.ParquetDataset(tmp_path)._discovery.byte_size
    assert np.array_equal(with_manifest, footers)
    assert 0.9 < decoded / footers.sum() < 1.1
    x = pqloader.ParquetDataset(tmp_path, columns=["x"])._discovery.byte_size.sum()
    assert 0.9 < _decoded(tmp_path, ["x"]) / x < 1.1  # a projection counts its columns only


def test_a_row_group_of_heavier_rows_than_its_files_is_sized_by_its_own_pages(
        tmp_path: Path) -> None:
    """Per-row sizes are a file's, from its largest row group: a file of long texts then
    short ones (sorted by length) had its long ones' row group sized 0.0 MiB, not 10."""
    heavy = pa.table({"text": [f"{i:05d}" * 20_000 for i in range(100)]})  # 100 KB each
    light = pa.table({"text": [f"row {i}" for i in range(30_000)]})
    with pq.ParquetWriter(tmp_path / "sorted.parquet", heavy.schema) as writer:
        writer.write_table(heavy)
        writer.write_table(light)
    sizes = pqloader.ParquetDataset(tmp_path)._discovery.byte_size
    decoded = [pq.ParquetFile(tmp_path / "sorted.parquet").read_row_group(i).nbytes
               for i in range(2)]
    assert 0.9 < sizes[0] / decoded[0] < 1.1  # was 1,451 bytes for 10 MB
    assert 0.9 < sizes[1] / decoded[1] < 1.25  # the file's own rows: as before


def test_columns_after_an_extension_column_over_a_struct(tmp_path: Path) -> None:
    """Its storage's fields are Parquet leaves: counted as one, every later column was read
    from the wrong leaves (found in review)."""
    import pyarrow.parquet as pq

    kind = pa.opaque(pa.struct([("p", pa.int32()), ("q", pa.int32())]), "geom", "vendor")
    storage = pa.array([{"p": 1, "q": 2}, {"p": 3, "q": 4}], kind.storage_type)
    pq.write_table(pa.table({"o": pa.ExtensionArray.from_storage(kind, storage),
                             "z": [10, 20], "w": ["a", "b"]}), tmp_path / "x.parquet")
    for columns in (["z"], ["w"], ["z", "w"]):
        ds = pqloader.ParquetDataset(tmp_path, columns=columns)
        assert [ds[i] for i in range(2)] == \
            pq.read_table(tmp_path / "x.parquet", columns=columns).to_pylist()


def test_a_projection_of_light_columns_beside_heavy_ones_is_sized_by_its_own(
        tmp_path: Path) -> None:
    """The row groups' pages count every column: as a floor for a projection of light ones
    they sized it 4,000x too large, and differently from a manifest (found in review)."""
    table = pa.table({"id": np.arange(20_200),
                      "text": ["x"] * 20_000 + [f"{i:05d}" * 10_000 for i in range(200)]})
    pqloader.write_dataset(table, tmp_path, row_group_size=20_000)
    with_manifest = pqloader.ParquetDataset(tmp_path, columns=["id"])._discovery.byte_size
    (tmp_path / "_pqloader_manifest.json").unlink()
    footers = pqloader.ParquetDataset(tmp_path, columns=["id"])._discovery.byte_size
    assert with_manifest.tolist() == footers.tolist() == [160_000, 1_600]


def _categories(tmp_path: Path) -> Path:
    """Strings of 50 category names, dictionary-encoded (the writers' default): their footers
    count each name once a row group, 7x less than they take decoded."""
    rng = np.random.default_rng(0)
    names = np.array([f"category-{i:02d}-" + "x" * 60 for i in range(50)])
    table = pa.table({"id": np.arange(40_000), "cat": names[rng.integers(0, 50, 40_000)],
                      "text": [f"row {i}" for i in range(40_000)]})
    pqloader.write_dataset(table, tmp_path, rows_per_file=10_000, row_group_size=5000)
    return tmp_path


def _nested(tmp_path: Path) -> Path:
    """Category names nested in a list (tags), a struct and a list of structs (chat roles),
    dictionary-encoded: the footers count each name once a row group, 9x less for the tags."""
    rng = np.random.default_rng(0)
    names = [f"category-{i:02d}-" + "x" * 30 for i in range(50)]
    n = 20_000
    table = pa.table({
        "id": np.arange(n),
        "tags": [[names[j] for j in rng.integers(0, 50, rng.integers(0, 9))] for _ in range(n)],
        "meta": [{"source": names[i % 50], "score": i} for i in range(n)],
        "msgs": [[{"role": "assistant" * 4, "n": k} for k in range(3)] for _ in range(n)],
        "m": pa.array([[(names[i % 50], i)] for i in range(n)],
                      pa.map_(pa.string(), pa.int64())),
    })
    pqloader.write_dataset(table, tmp_path, rows_per_file=5000, row_group_size=2500)
    return tmp_path


def test_dictionary_encoded_strings_are_measured_not_guessed(tmp_path: Path) -> None:
    path = _categories(tmp_path)
    decoded = _decoded(path)
    with_manifest = pqloader.ParquetDataset(path)._discovery.byte_size
    (path / "_pqloader_manifest.json").unlink()
    footers = pqloader.ParquetDataset(path)._discovery.byte_size
    assert np.array_equal(with_manifest, footers)
    assert 0.9 < decoded / footers.sum() < 1.1  # was 3.7x (the categories alone 19x)
    cat = pqloader.ParquetDataset(path, columns=["cat"])._discovery.byte_size.sum()
    assert 0.9 < _decoded(path, ["cat"]) / cat < 1.1
    one = pqloader.ParquetDataset(path, columns=["id"])._discovery.byte_size.sum()
    assert one == 8 * 40_000  # nothing measured for a projection without them


@pytest.mark.parametrize("column", ["cat", "tags"])
def test_dictionary_encoded_strings_are_measured_remotely(tmp_path: Path, column: str) -> None:
    fsspec = pytest.importorskip("fsspec")
    path = (_categories if column == "cat" else _nested)(tmp_path / "d")
    (path / "_pqloader_manifest.json").unlink()
    memory = fsspec.filesystem("memory")
    root = f"/strings-{tmp_path.name}"
    for f in sorted(path.glob("*.parquet")):
        memory.pipe(f"{root}/{f.name}", f.read_bytes())
    ds = pqloader.ParquetDataset(f"memory://{root}/", columns=[column])
    assert 0.9 < _decoded(path, [column]) / ds._discovery.byte_size.sum() < 1.1
    assert np.array_equal(ds._discovery.byte_size,
                          pqloader.ParquetDataset(path, columns=[column])._discovery.byte_size)


def test_a_version_2_manifest_of_strings_is_not_trusted_for_their_sizes(tmp_path: Path) -> None:
    path = _categories(tmp_path)
    manifest = path / "_pqloader_manifest.json"
    body = json.loads(manifest.read_text())
    body["version"] = 2  # as written before strings were measured: the footers' 4 bytes a row
    for f in body["files"]:
        f["row_bytes"]["cat"] = 4.0
    manifest.write_text(json.dumps(body))
    ds = pqloader.ParquetDataset(path, columns=["cat"])
    assert 0.9 < _decoded(path, ["cat"]) / ds._discovery.byte_size.sum() < 1.1
    assert all(f.metadata is not None for f in ds._discovery.files)  # the footers were read


def test_each_file_strings_are_scaled_by_their_own_lengths(tmp_path: Path) -> None:
    """One file measured stands for the others through its values' lengths (from the footers'
    min and max): long names in the first file, short in the rest, and the other way round.
    The first file's mean length alone overcounted the rest 7x, and refused a budget."""
    rng = np.random.default_rng(0)
    long_names = pa.array([f"{c}" * 90 for c in "abcd"])
    short_names = pa.array(["ab", "cd"])
    for order, (first, rest) in enumerate([(long_names, short_names),
                                           (short_names, long_names)]):
        path = tmp_path / str(order)
        path.mkdir()
        pq.write_table(pa.table({"s": first.take(rng.integers(0, len(first), 1000))}),
                       path / "a.parquet")
        for k in range(3):
            pq.write_table(pa.table({"s": rest.take(rng.integers(0, len(rest), 100_000))}),
                           path / f"b{k}.parquet")
        d = pqloader.ParquetDataset(path)._discovery
        for fragment, f in enumerate(sorted(path.glob("*.parquet"))):
            decoded = pq.read_table(f).nbytes
            assert 0.9 < decoded / d.byte_size[fragment] < 1.1, (order, f.name)


@pytest.mark.parametrize("case", ["no statistics", "statistics in the first file only",
                                  "values over 4 KB", "empty in the first file"])
@pytest.mark.parametrize("manifest", [False, True])
def test_strings_without_min_and_max_values_are_measured_in_their_own_files(
        tmp_path: Path, case: str, manifest: bool) -> None:
    """Short names in the first file, long ones in the rest, and no min and max values to scale
    the first file's sample by: written without statistics, or over 4 KB (Arrow leaves those out
    of them), or "" alone there (min and max of length 0). The others were sized as the first:
    40x (600x, 123x) too small."""
    from pqloader._manifest import write_manifest

    rng = np.random.default_rng(0)
    length = 5000 if case == "values over 4 KB" else 800
    stats = case != "no statistics"
    first = [""] * 5000 if case == "empty in the first file" else \
        [f"{i % 20:08d}" for i in range(5000)]
    pq.write_table(pa.table({"s": first}), tmp_path / "a.parquet", write_statistics=stats)
    long_names = pa.array([f"{i:0{length}d}" for i in range(20)])
    for k in range(12):  # more than are measured: the rest take the longest measured
        pq.write_table(pa.table({"s": long_names.take(rng.integers(0, 20, 2000 + k))}),
                       tmp_path / f"b{k:02d}.parquet", write_statistics=stats and case !=
                       "statistics in the first file only")
    files = sorted(tmp_path.glob("*.parquet"))
    if manifest:
        write_manifest(tmp_path, [str(f) for f in files])
    d = pqloader.ParquetDataset(tmp_path)._discovery
    assert all((f.metadata is None) == manifest for f in d.files)
    for fragment, f in enumerate(files):
        assert 0.9 < pq.read_table(f).nbytes / d.byte_size[fragment] < 1.1, f.name


@pytest.mark.parametrize("column", ["s", "tags"])
@pytest.mark.parametrize("manifest", [False, True])
def test_strings_null_in_the_first_file_are_measured_where_they_have_values(
        tmp_path: Path, column: str, manifest: bool) -> None:
    """A column a pipeline filled only later: null in the first file, 90-byte names after. It
    was measured there as empty, and every other file sized 24x too small (12x in lists)."""
    from pqloader._manifest import write_manifest

    rng = np.random.default_rng(0)
    names = pa.array([c * 90 for c in "abcd"])
    t = pa.list_(pa.string()) if column == "tags" else pa.string()
    pq.write_table(pa.table({"id": np.arange(1000), column: pa.nulls(1000, t)}),
                   tmp_path / "a.parquet")
    for k in range(3):
        values = names.take(rng.integers(0, 4, 50_000))
        if column == "tags":
            values = pa.ListArray.from_arrays(np.arange(50_001, dtype=np.int32), values)
        pq.write_table(pa.table({"id": np.arange(50_000), column: values}),
                       tmp_path / f"b{k}.parquet")
    files = sorted(tmp_path.glob("*.parquet"))
    if manifest:
        write_manifest(tmp_path, [str(f) for f in files])
    d = pqloader.ParquetDataset(tmp_path, columns=[column])._discovery
    assert all((f.metadata is None) == manifest for f in d.files)
    for fragment, f in enumerate(files[1:], 1):
        assert 0.9 < pq.read_table(f, columns=[column]).nbytes / d.byte_size[fragment] < 1.1


@pytest.mark.parametrize("manifest", [False, True])
def test_strings_sparse_where_measured_are_sized_per_value_elsewhere(
        tmp_path: Path, manifest: bool) -> None:
    """A column a pipeline filled later: 1 row in 100 in the first file, every row after. Its
    mean length there counted the nulls, and sized every other file 20x too small."""
    from pqloader._manifest import write_manifest

    names = [f"category_{i:03d}_" + "q" * 80 for i in range(50)]
    n = 20_000
    pq.write_table(pa.table({"s": [names[i % 50] if i % 100 == 0 else None for i in range(n)]}),
                   tmp_path / "a.parquet")
    for k in range(3):
        pq.write_table(pa.table({"s": [names[i % 50] for i in range(n)]}),
                       tmp_path / f"b{k}.parquet")
    files = sorted(tmp_path.glob("*.parquet"))
    if manifest:
        write_manifest(tmp_path, [str(f) for f in files])
    d = pqloader.ParquetDataset(tmp_path)._discovery
    for fragment, f in enumerate(files):
        assert 0.85 < pq.read_table(f).nbytes / d.byte_size[fragment] < 1.15, f.name


def test_a_version_4_manifest_of_strings_is_not_trusted_for_their_sizes(tmp_path: Path) -> None:
    path = _categories(tmp_path)
    manifest = path / "_pqloader_manifest.json"
    body = json.loads(manifest.read_text())
    body["version"] = 4  # as written before strings null in the first file were measured
    manifest.write_text(json.dumps(body))
    ds = pqloader.ParquetDataset(path, columns=["cat"])
    assert all(f.metadata is not None for f in ds._discovery.files)  # the footers were read
    assert 0.9 < _decoded(path, ["cat"]) / ds._discovery.byte_size.sum() < 1.1


def test_measuring_strings_decodes_none_of_them(tmp_path: Path) -> None:
    """4 distinct 1 KB values over 400,000 rows: 130 KB encoded, 400 MB decoded. Opening counts
    their lengths through the dictionary; it read the column whole (Arrow's pool peaked at 1 GB
    for 1M rows)."""
    values = pa.array([c * 1000 for c in "abcd"])
    pq.write_table(pa.table({"s": values.take(np.arange(400_000) % 4)}), tmp_path / "a.parquet")
    code = (f"import pyarrow as pa, pqloader; d = pqloader.ParquetDataset({str(tmp_path)!r})"
            "._discovery; print(int(d.byte_size.sum()), pa.default_memory_pool().max_memory())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert 0.9 < 400_000 * 1004 / int(out[0]) < 1.1
    assert int(out[1]) < 50 * 2**20, f"Arrow's pool peaked at {int(out[1]) / 2**20:.0f} MiB"


@pytest.mark.parametrize("column", ["tags", "meta", "msgs", "m"])
def test_dictionary_encoded_strings_in_lists_and_structs_are_measured(
        tmp_path: Path, column: str) -> None:
    path = _nested(tmp_path)
    with_manifest = pqloader.ParquetDataset(path, columns=[column])._discovery.byte_size
    (path / "_pqloader_manifest.json").unlink()
    footers = pqloader.ParquetDataset(path, columns=[column])._discovery.byte_size
    assert np.array_equal(with_manifest, footers)
    assert 0.85 < _decoded(path, [column]) / footers.sum() < 1.15  # tags: was 9x


def test_a_version_3_manifest_of_nested_strings_is_not_trusted_for_their_sizes(
        tmp_path: Path) -> None:
    path = _nested(tmp_path)
    manifest = path / "_pqloader_manifest.json"
    body = json.loads(manifest.read_text())
    body["version"] = 3  # as written before nested strings were measured
    manifest.write_text(json.dumps(body))
    ds = pqloader.ParquetDataset(path, columns=["tags"])
    assert all(f.metadata is not None for f in ds._discovery.files)  # the footers were read
    assert 0.85 < _decoded(path, ["tags"]) / ds._discovery.byte_size.sum() < 1.15


def test_a_top_level_column_named_like_a_nested_one_is_left_to_the_footer(
        tmp_path: Path) -> None:
    """``a.b`` beside a struct ``a`` with a field ``b``: one path for two leaves, which pyarrow
    cannot tell apart by name. Neither is measured (nor misread)."""
    table = pa.table({"a.b": ["x" * 40] * 1000, "a": [{"b": "y" * 40}] * 1000})
    pq.write_table(table, tmp_path / "a.parquet")
    ds = pqloader.ParquetDataset(tmp_path)
    assert [row["a.b"] for row in ds.__getitems__([0, 999])] == ["x" * 40] * 2
    assert ds._discovery.byte_size.sum() > 0


def test_columns_read_as_dictionaries_are_not_sized_as_strings(tmp_path: Path) -> None:
    """A pandas categorical, or a list of dictionary strings, is read as Arrow dictionaries,
    as small as its footer says: sized as decoded strings it took 50-200x its memory (a budget
    of 1 GiB was refused for 14 MB)."""
    rng = np.random.default_rng(0)
    names = [f"category-{i:02d}-" + "x" * 60 for i in range(50)]
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"id": np.arange(20_000), "cat": pd.Categorical(
        [names[i] for i in rng.integers(0, 50, 20_000)])})
    pqloader.write_dataset(frame, tmp_path / "pandas", rows_per_file=10_000)
    tags = pa.array([[names[i % 50]] * 3 for i in range(20_000)],
                    pa.list_(pa.dictionary(pa.int32(), pa.string())))
    pq.write_table(pa.table({"tags": tags}), tmp_path / "lists.parquet")
    for path, column in ((tmp_path / "pandas", "cat"), (tmp_path / "lists.parquet", "tags")):
        ds = pqloader.ParquetDataset(path, columns=[column])
        assert pa.types.is_dictionary(ds.columns[column]) or pa.types.is_dictionary(
            ds.columns[column].value_type)
        decoded = sum(pq.read_table(f, columns=[column]).nbytes for f in
                      ([path] if path.is_file() else sorted(path.glob("*.parquet"))))
        assert 0.25 < decoded / ds._discovery.byte_size.sum() < 4, column  # was 1/50-1/200


def test_a_projected_string_column_is_measured_beside_large_unprojected_ones(
        tmp_path: Path) -> None:
    """Columns left out of ``columns=`` do not use up what opening may read to measure."""
    rng = np.random.default_rng(0)
    n = 1_000_000
    tags = pa.ListArray.from_arrays(np.arange(0, 8 * n + 1, 8, dtype=np.int32),
                                    pa.array([f"tag-{i:03d}" for i in range(128)]).take(
                                        rng.integers(0, 128, 8 * n)))
    cat = pa.array([f"category-{i:04d}-" + "x" * 30 for i in range(4096)]).take(
        rng.integers(0, 4096, n))
    pq.write_table(pa.table({"tags": tags, "cat": cat}), tmp_path / "a.parquet",
                   row_group_size=n)
    rg = pq.read_metadata(tmp_path / "a.parquet").row_group(0)
    sizes = [rg.column(i).total_uncompressed_size for i in range(2)]
    assert sizes[0] < 8 << 20 < sum(sizes)  # both together: more than opening may read
    ds = pqloader.ParquetDataset(tmp_path, columns=["cat"])
    assert 0.9 < _decoded(tmp_path, ["cat"]) / ds._discovery.byte_size.sum() < 1.1  # was 12x


def test_a_dictionary_fallen_back_to_plain_pages_is_not_read_to_measure(tmp_path: Path) -> None:
    """Distinct 4 KB values: the writer's dictionary fills and the rest is plain pages, 1 MB
    compressed and 400 MB read; the footer's size is right, and reading it took 900 MiB."""
    values = pa.array([f"{i:08d}" + "a" * 4088 for i in range(100_000)])
    pq.write_table(pa.table({"s": pa.ListArray.from_arrays(
        np.arange(0, 100_001, dtype=np.int32), values)}), tmp_path / "a.parquet",
        compression="zstd")
    code = (f"import pyarrow as pa, pqloader; d = pqloader.ParquetDataset({str(tmp_path)!r})"
            "._discovery; print(int(d.byte_size.sum()), pa.default_memory_pool().max_memory())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert 0.9 < _decoded(tmp_path) / int(out[0]) < 1.1
    assert int(out[1]) < 50 * 2**20, f"Arrow's pool peaked at {int(out[1]) / 2**20:.0f} MiB"


def test_a_version_1_manifest_is_still_read(tmp_path: Path) -> None:
    pqloader.write_dataset(pa.table({"id": np.arange(100)}), tmp_path, rows_per_file=50)
    manifest = tmp_path / "_pqloader_manifest.json"
    body = json.loads(manifest.read_text())
    body["version"] = 1
    for f in body["files"]:
        del f["row_bytes"]
    manifest.write_text(json.dumps(body))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an old manifest is not stale
        ds = pqloader.ParquetDataset(tmp_path)
    assert all(f.metadata is None for f in ds._discovery.files), "no footer was read"
    assert list(ds._discovery.byte_size) == [r["bytes"][0] for r in body["files"]]
