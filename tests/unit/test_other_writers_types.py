"""Arrow types as other writers leave them: string and binary views (pyarrow >= 16, Polars),
list elements declared not null, a column name written twice, INT96 timestamps (Spark)."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

import pqloader


def _views(tmp_path: Path) -> Path:
    table = pa.table({
        "id": np.arange(10),
        "s": pa.array([f"v{i}" for i in range(10)], pa.string_view()),
        "b": pa.array([b"x%d" % i for i in range(10)], pa.binary_view()),
        "tags": pa.array([[f"t{i}"] * (i % 3) for i in range(10)], pa.list_(pa.string_view())),
    })
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=4)
    assert pq.read_schema(tmp_path / "a.parquet").field("s").type == pa.string_view()
    return tmp_path


def test_string_views_are_read_as_large_strings(tmp_path: Path) -> None:
    ds = pqloader.ParquetDataset(_views(tmp_path))
    assert ds.columns["s"] == pa.large_string() and ds.columns["b"] == pa.large_binary()
    assert ds.columns["tags"] == pa.list_(pa.large_string())
    assert ds.__getitems__([7, 2]) == [  # Arrow's take has no kernel for views
        {"id": 7, "s": "v7", "b": b"x7", "tags": ["t7"]}, {"id": 2, "s": "v2", "b": b"x2",
                                                          "tags": ["t2", "t2"]}]
    flat = pqloader.ParquetDataset(tmp_path, columns=["id", "s", "b"])
    batches = list(pqloader.DataLoader(flat, batch_size=4, shuffle=True, seed=3, num_workers=2))
    ids = torch.cat([b["id"] for b in batches]).tolist()
    assert sorted(ids) == list(range(10))
    assert [s for b in batches for s in b["s"]] == [f"v{i}" for i in ids]
    assert [x for b in batches for x in b["b"]] == [b"x%d" % i for i in ids]


def test_string_views_pass_to_collate_fn_and_filters(tmp_path: Path) -> None:
    ds = pqloader.ParquetDataset(_views(tmp_path), filter=[("s", "in", ["v1", "v5", "v8"])])
    assert len(ds) == 3
    loader = pqloader.DataLoader(ds, batch_size=2, shuffle=True, collate_fn=lambda rb: rb)
    rows = sorted((r for rb in loader for r in rb.to_pylist()), key=lambda r: r["id"])
    assert [(r["id"], r["tags"]) for r in rows] == [(1, ["t1"]), (5, ["t5", "t5"]), (8, ["t8"] * 2)]


def test_list_views_are_read_as_lists(tmp_path: Path) -> None:
    """Token lists written as list views (pyarrow >= 16) were refused; and pyarrow's own cast
    of a list view holding a null list made an invalid array (its offsets one short)."""
    pq.write_table(pa.table({
        "id": [0, 1, 2, 3],
        "tok": pa.array([[5, 6], [], None, [7]], pa.list_view(pa.int32())),
        "words": pa.array([["a"], None, ["b", "c"], []], pa.list_view(pa.string_view())),
    }), tmp_path / "a.parquet", row_group_size=3)
    out_of_order = pa.ListViewArray.from_arrays(  # views need not follow their rows' order
        pa.array([2, 0], pa.int32()), pa.array([1, 2], pa.int32()),
        pa.array([3, 4, 8], pa.int32()))
    pq.write_table(pa.table({"id": [4, 5], "tok": out_of_order,
                             "words": pa.array([["d"], ["e"]], pa.list_(pa.string()))}),
                   tmp_path / "b.parquet")
    ds = pqloader.ParquetDataset(tmp_path)
    assert ds.columns["tok"] == pa.list_(pa.int32())
    assert ds.columns["words"] == pa.list_(pa.large_string())
    assert [ds[i]["words"] for i in range(6)] == [["a"], None, ["b", "c"], [], ["d"], ["e"]]
    nested = tmp_path.parent / f"{tmp_path.name}-nested"
    nested.mkdir()
    inner = pa.list_view(pa.int32())
    pq.write_table(pa.table({  # views inside lists and maps: pyarrow's cast broke them
        "id": [0, 1, 2],
        "deep": pa.array([[[1, 2], None], None, [[3]]], pa.list_(inner)),
        "m": pa.array([[("a", [1])], None, [("b", None), ("c", [2, 3])]],
                      pa.map_(pa.string(), inner)),
    }), nested / "a.parquet", row_group_size=1)  # read together, then sliced: offsets
    deep = pqloader.ParquetDataset(nested)
    assert deep.columns["deep"] == pa.list_(pa.list_(pa.int32()))
    assert [deep[i]["deep"] for i in range(3)] == [[[1, 2], None], None, [[3]]]
    assert [deep[i]["m"] for i in range(3)] == [[("a", [1])], None, [("b", None),
                                                                     ("c", [2, 3])]]
    (batch,) = pqloader.DataLoader(deep, batch_size=3, collate_fn=lambda rb: rb)  # its row
    assert batch.column("m").to_pylist() == [deep[i]["m"] for i in range(3)]  # groups read
    # together, then sliced: a map's offsets said its slice's offset (found in review)
    tokens = pqloader.ParquetDataset(tmp_path, columns=["id", "tok"])
    batch = next(iter(pqloader.DataLoader(tokens, batch_size=6)))
    assert batch["id"].tolist() == list(range(6))
    assert batch["tok_lengths"].tolist() == [2, 0, 0, 1, 1, 2]
    assert batch["tok"].tolist() == [[5, 6], [0, 0], [0, 0], [7, 0], [8, 0], [3, 4]]


def test_a_null_list_of_elements_declared_not_null_is_a_row_of_nan(tmp_path: Path) -> None:
    """Spark's ``array<float>`` with ``containsNull=false``: the elements' field says not null,
    and a null list must still become NaN, as with nullable elements (it was a raw
    ``ArrowTypeError``)."""
    element = pa.field("element", pa.float32(), nullable=False)
    table = pa.table({"id": [0, 1, 2], "emb": pa.array([[1.0, 2.0], None, [3.0, 4.0]],
                                                       pa.list_(element, 2))})
    pq.write_table(table, tmp_path / "a.parquet")
    for workers in (0, 2):
        (batch,) = pqloader.DataLoader(pqloader.ParquetDataset(tmp_path), batch_size=3,
                                       num_workers=workers)
        emb = batch["emb"]
        assert emb[0].tolist() == [1.0, 2.0] and emb[2].tolist() == [3.0, 4.0]
        assert all(math.isnan(v) for v in emb[1].tolist())


def test_a_column_name_written_twice_is_named(tmp_path: Path) -> None:
    """pyarrow's lookup of a twice-written name says "no such column": the error said 'x' was
    not in a file whose columns it listed as ['id', 'x', 'x']."""
    table = pa.Table.from_arrays([pa.array([0, 1]), pa.array([1.0, 2.0]), pa.array([3, 4])],
                                 names=["id", "x", "x"])
    pq.write_table(table, tmp_path / "a.parquet")
    for columns in (None, ["x"]):
        with pytest.raises(pqloader.SchemaMismatchError, match=r"'x' appears 2 times in .*"
                           r"a\.parquet; .*rename them when writing"):
            pqloader.ParquetDataset(tmp_path, columns=columns)
    assert len(pqloader.ParquetDataset(tmp_path, columns=["id"])) == 2
    kept = pqloader.ParquetDataset(tmp_path, columns=["id"], filter=pc.field("id") > 0)
    assert [r["id"] for r in kept.__getitems__([0])] == [1]  # was a raw KeyError


def test_a_name_written_twice_in_a_later_file_is_named(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": [0], "x": [1.0]}), tmp_path / "a.parquet")
    pq.write_table(pa.Table.from_arrays([pa.array([1]), pa.array([2.0]), pa.array([3.0])],
                                        names=["id", "x", "x"]), tmp_path / "b.parquet")
    with pytest.raises(pqloader.SchemaMismatchError, match=r"'x' appears 2 times in .*b\.parquet"):
        pqloader.ParquetDataset(tmp_path, columns=["id", "x"])


@pytest.mark.parametrize(("values", "cast"), [
    (pa.array([1, None], pa.int64()), True),
    (pa.array([1, None], pa.timestamp("us", "UTC")), False),
    (pa.array([True, None]), False),
    (pa.array([[1], [None]]), False),
])
def test_null_advice_fits_the_type(tmp_path: Path, values: pa.Array, cast: bool) -> None:
    """Casting to float is advice for integers, not for a timestamp or a bool."""
    pq.write_table(pa.table({"v": values}), tmp_path / "a.parquet")
    with pytest.raises(pqloader.DataError, match=r"column 'v' .*null values.*collate_fn=") as info:
        list(pqloader.DataLoader(pqloader.ParquetDataset(tmp_path), batch_size=2))
    assert ("cast the column to float" in str(info.value)) == cast, info.value


def _strict_then_loose(tmp_path: Path) -> Path:
    """Spark's containsNull=false and nullable=false in one job's files, nullable in the next's
    (appended by another job, or pandas)."""
    not_null = {"nullable": False}
    strict = pa.schema([
        pa.field("id", pa.int64()),
        pa.field("v", pa.list_(pa.field("element", pa.int64(), **not_null))),
        pa.field("s", pa.struct([pa.field("a", pa.int64(), **not_null)])),
        pa.field("m", pa.map_(pa.string(), pa.field("value", pa.int64(), **not_null))),
        pa.field("f", pa.list_(pa.field("element", pa.float32(), **not_null), 2)),
    ])
    pq.write_table(pa.table({"id": [0, 1], "v": [[1], [2, 3]], "s": [{"a": 1}, {"a": 2}],
                             "m": [[("k", 1)], []], "f": [[1, 2], [3, 4]]}, schema=strict),
                   tmp_path / "a.parquet")
    loose = pa.schema([pa.field(f.name, f.type) for f in [
        pa.field("id", pa.int64()), pa.field("v", pa.list_(pa.int64())),
        pa.field("s", pa.struct([pa.field("a", pa.int64())])),
        pa.field("m", pa.map_(pa.string(), pa.int64())),
        pa.field("f", pa.list_(pa.float32(), 2))]])
    pq.write_table(pa.table({"id": [2, 3], "v": [[None], None], "s": [{"a": None}, None],
                             "m": [[("k", None)], None], "f": [[None, 5], None]}, schema=loose),
                   tmp_path / "b.parquet")
    return tmp_path


def test_nested_fields_not_null_in_one_file_only_are_nullable(tmp_path: Path) -> None:
    """A struct field not null in the first file only was refused ("struct<a: int64 not null>
    in a.parquet but struct<a: int64>"); a list's elements were declared not null while the
    next file's batches held nulls there (an Arrow array that lies about its nulls, handed to
    collate_fn)."""
    ds = pqloader.ParquetDataset(_strict_then_loose(tmp_path))
    strict, loose = (pq.read_schema(tmp_path / f"{n}.parquet") for n in "ab")
    assert not any(strict.field(n).type.equals(loose.field(n).type) for n in "vsmf")
    for name in "vsmf":  # the nullable type, whatever the names of list elements
        assert ds.columns[name] == loose.field(name).type, name
    (batch,) = pqloader.DataLoader(ds, batch_size=4, collate_fn=lambda t: t)
    assert batch.schema.field("v").type.value_field.nullable
    assert batch.column("v").to_pylist() == [[1], [2, 3], [None], None]
    assert batch.column("s").to_pylist() == [{"a": 1}, {"a": 2}, {"a": None}, None]
    assert batch.column("m").to_pylist() == [[("k", 1)], [], [("k", None)], None]
    assert ds[3]["s"] is None and ds[2]["s"] == {"a": None}
    fixed = pqloader.ParquetDataset(tmp_path, columns=["f"])
    f = next(iter(pqloader.DataLoader(fixed, batch_size=4)))["f"]
    assert f.shape == (4, 2) and math.isnan(f[2, 0]) and bool(torch.isnan(f[3]).all())


def test_nulls_in_lists_of_floats_are_nan(tmp_path: Path) -> None:
    """As in a float column (they were a DataError)."""
    pq.write_table(pa.table({"v": pa.array([[1.0, None], None, [2.0]], pa.list_(pa.float32()))}),
                   tmp_path / "a.parquet")
    batch = next(iter(pqloader.DataLoader(pqloader.ParquetDataset(tmp_path), batch_size=3)))
    assert batch["v_lengths"].tolist() == [2, 0, 1]
    assert batch["v"][0, 0] == 1.0 and math.isnan(batch["v"][0, 1]) and batch["v"][2, 0] == 2.0


def _typed_null_in_some_files(tmp_path: Path) -> Path:
    """Columns typed ``null`` in some files: an empty shard pandas wrote from an object column
    without values, and a file whose values are all null (a column pandas had all None)."""
    frame = pd.DataFrame({"id": [0, 1, 2], "text": ["a", None, "c"], "x": [0.5, 1.5, 2.5],
                          "tags": [[1], [], [2, 3]]})
    frame.iloc[:0].astype({"text": object}).to_parquet(tmp_path / "a-empty.parquet", index=False)
    pq.write_table(pa.table({"id": [3, 4], "text": pa.nulls(2), "x": pa.nulls(2),
                             "tags": pa.array([[], None], pa.list_(pa.null()))}),
                   tmp_path / "b-nulls.parquet")
    frame.to_parquet(tmp_path / "c-values.parquet", index=False)
    assert pq.read_schema(tmp_path / "a-empty.parquet").field("text").type == pa.null()
    return tmp_path


def test_a_column_typed_null_in_some_files_takes_the_others_type(tmp_path: Path) -> None:
    """They failed to open ("column 'text' is null in a-empty.parquet but large_string in
    c-values.parquet"); pyarrow's own read_table reads them."""
    ds = pqloader.ParquetDataset(_typed_null_in_some_files(tmp_path))
    assert ds.columns == {"id": pa.int64(), "text": pa.large_string(), "x": pa.float64(),
                          "tags": pa.list_(pa.int64())}
    assert len(ds) == 5
    assert [ds[i]["text"] for i in range(5)] == [None, None, "a", None, "c"]
    for workers in (0, 2):
        batches = list(pqloader.DataLoader(ds, batch_size=5, num_workers=workers))
        (batch,) = batches
        assert batch["id"].tolist() == [3, 4, 0, 1, 2] and batch["text"][:2] == [None, None]
        assert bool(torch.isnan(batch["x"][:2]).all()) and batch["x"][2] == 0.5
        assert batch["tags_lengths"].tolist() == [0, 0, 1, 0, 2]
    kept = pqloader.ParquetDataset(tmp_path, filter=pc.field("x") > 1.0)
    assert [kept[i]["id"] for i in range(len(kept))] == [1, 2]


@pytest.mark.parametrize("null_first", [True, False])
def test_a_dictionary_column_typed_null_in_another_file_stays_a_dictionary(
        tmp_path: Path, null_first: bool) -> None:
    """Whatever the files' order: with the null file last it was read as plain strings."""
    categories = pa.array(["p", "q"]).dictionary_encode()
    tags = pa.array([["p"], ["q", "p"]], pa.list_(pa.dictionary(pa.int32(), pa.string())))
    first, last = ("a", "b") if null_first else ("b", "a")
    pq.write_table(pa.table({"x": pa.nulls(2), "t": pa.array([None, []], pa.list_(
        pa.null()))}), tmp_path / f"{first}.parquet")
    pq.write_table(pa.table({"x": categories, "t": tags}), tmp_path / f"{last}.parquet")
    ds = pqloader.ParquetDataset(tmp_path)
    assert ds.columns == {"x": categories.type, "t": tags.type}
    (batch,) = pqloader.DataLoader(ds, batch_size=4, collate_fn=lambda b: b)
    assert batch.schema.field("x").type == categories.type
    values = [None, None, "p", "q"] if null_first else ["p", "q", None, None]
    assert batch.column("x").to_pylist() == values


def test_a_type_clash_names_the_file_that_typed_the_column(tmp_path: Path) -> None:
    _typed_null_in_some_files(tmp_path)
    pq.write_table(pa.table({"id": [5], "text": [7], "x": [1.0], "tags": [[1]]}),
                   tmp_path / "d-ints.parquet")
    with pytest.raises(pqloader.SchemaMismatchError,
                       match=r"'text' is large_string in .*c-values\.parquet but int64 in "
                             r".*d-ints\.parquet"):
        pqloader.ParquetDataset(tmp_path)


def test_a_filter_sees_the_type_a_column_typed_null_first_takes(tmp_path: Path) -> None:
    """Checked against the first file's types, a filter of a column typed null there failed
    to bind ("no kernel matching input types (null)"), or pruned a row group of NaN floats by
    its statistics as if the column held none (rows lost)."""
    pq.write_table(pa.table({"id": pa.array([], pa.int64()), "x": pa.nulls(0),
                             "s": pa.nulls(0)}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [1, 2], "x": [1.0, float("nan")], "s": ["ab", "cd"]}),
                   tmp_path / "b.parquet")
    pq.write_table(pa.table({"id": [3], "x": [3.0], "s": ["ax"]}), tmp_path / "c.parquet")

    def kept(keep: Any) -> list[int]:
        ds = pqloader.ParquetDataset(tmp_path, filter=keep)
        return sorted(r["id"] for r in ds.__getitems__(range(len(ds))))

    assert kept([("x", "!=", 1.0)]) == [2, 3]  # NaN != 1.0: kept, as pyarrow keeps it
    assert kept([("s", "in", ["ab"])]) == [1]
    assert kept(pc.starts_with(pc.field("s"), "a")) == [1, 3]


def test_int96_timestamps_keep_dates_past_2262_and_before_1677(tmp_path: Path) -> None:
    """Spark, Hive and Impala write INT96; pyarrow reads it as nanoseconds by default, which
    wrapped 9999-12-31 (a warehouse's "still valid") into 1816-03-29, silently."""
    when = [dt.datetime(1500, 1, 1), dt.datetime(2024, 1, 1, 12, 30, 0, 5), None,
            dt.datetime(9999, 12, 31)]
    part = pa.table({"id": range(4), "valid_to": pa.array(when, pa.timestamp("us")),
                     "spans": pa.array([{"to": w} for w in when],
                                       pa.struct([("to", pa.timestamp("us"))]))})
    for name, start, stop in (("a", 0, 2), ("b", 3, 4)):  # the null row left out
        pq.write_table(part.slice(start, stop - start), tmp_path / f"{name}.parquet",
                       use_deprecated_int96_timestamps=True, store_schema=False)  # as Spark
    ds = pqloader.ParquetDataset(tmp_path)
    assert ds.columns["valid_to"] == pa.timestamp("us")
    assert ds.columns["spans"] == pa.struct([("to", pa.timestamp("us"))])
    rows = ds.__getitems__([0, 1, 2])
    assert [r["valid_to"] for r in rows] == [when[0], when[1], when[3]]
    assert [r["spans"]["to"] for r in rows] == [when[0], when[1], when[3]]
    batch = next(iter(pqloader.DataLoader(pqloader.ParquetDataset(
        tmp_path, columns=["id", "valid_to"]), batch_size=3)))
    epoch = dt.datetime(1970, 1, 1)
    assert batch["valid_to"].tolist() == [(w - epoch) // dt.timedelta(microseconds=1)
                                          for w in (when[0], when[1], when[3])]
    late = pqloader.ParquetDataset(tmp_path, filter=pc.field("valid_to") > pa.scalar(
        dt.datetime(3000, 1, 1), pa.timestamp("us")))
    assert [r["id"] for r in late.__getitems__(range(len(late)))] == [3]


def test_string_and_large_string_files_make_one_dataset(tmp_path: Path) -> None:
    """pandas 2 writes string, pandas 3 large_string: a dataset appended to across an upgrade
    was refused ("'s' is string in a but large_string in b")."""
    pq.write_table(pa.table({"id": [0, 1], "s": pa.array(["a", "b"]), "b": [b"x", b"y"],
                             "l": pa.array([[1], [2, 3]], pa.list_(pa.int32()))}),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [2, 3], "s": pa.array(["c", None], pa.large_string()),
                             "b": pa.array([b"z", b"w"], pa.large_binary()),
                             "l": pa.array([[4], []], pa.large_list(pa.int32()))}),
                   tmp_path / "b.parquet")
    ds = pqloader.ParquetDataset(tmp_path)
    assert ds.columns == {"id": pa.int64(), "s": pa.large_string(), "b": pa.large_binary(),
                          "l": pa.large_list(pa.field("element", pa.int32()))}
    assert ds.__getitems__([1, 2]) == [{"id": 1, "s": "b", "b": b"y", "l": [2, 3]},
                                       {"id": 2, "s": "c", "b": b"z", "l": [4]}]
    batch = next(iter(pqloader.DataLoader(ds, batch_size=4, shuffle=True, seed=1)))
    rows = {i: (s, b) for i, s, b in zip(batch["id"].tolist(), batch["s"], batch["b"],
                                         strict=True)}
    assert rows == {0: ("a", b"x"), 1: ("b", b"y"), 2: ("c", b"z"), 3: (None, b"w")}
    assert batch["l_lengths"].tolist() == [[1, 2, 1, 0][i] for i in batch["id"].tolist()]
    assert len(pqloader.ParquetDataset(tmp_path, filter=pc.field("s") == "c")) == 1


def test_int96_files_beside_nanosecond_files_read_in_nanoseconds(tmp_path: Path) -> None:
    """Spark's INT96 (read in us) beside pandas' datetime64[ns] (INT64 ns): one dataset, in
    the finer unit, as before INT96 was read in us; a date ns cannot hold is named."""
    when = [dt.datetime(2000, 1, 1), dt.datetime(2024, 1, 1, 0, 0, 0, 5)]
    table = pa.table({"id": [0, 1], "t": pa.array(when, pa.timestamp("ns"))})
    pq.write_table(table, tmp_path / "spark.parquet", use_deprecated_int96_timestamps=True,
                   store_schema=False)
    pq.write_table(table, tmp_path / "pandas.parquet")
    ds = pqloader.ParquetDataset(tmp_path)
    assert ds.columns["t"] == pa.timestamp("ns")
    assert [r["t"] for r in ds.__getitems__(range(4))] == when * 2
    far = pa.table({"id": [2], "t": pa.array([dt.datetime(9999, 12, 31)], pa.timestamp("us"))})
    pq.write_table(far, tmp_path / "spark.parquet", use_deprecated_int96_timestamps=True,
                   store_schema=False)
    ds = pqloader.ParquetDataset(tmp_path)
    with pytest.raises(pqloader.DataError, match=r"spark\.parquet: row group 0, column 't': "
                       r"its timestamp\[us\] values do not fit the dataset's timestamp\[ns\]"):
        ds.__getitems__(range(3))
