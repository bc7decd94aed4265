"""Opening what people have on disk: folders that are links, names with glob characters,
Spark's leftovers under a glob, files that change under a manifest, nullability that differs
between files, hive folders that shadow a column."""

from __future__ import annotations

import itertools
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader


def _write(path: Path, **columns: list[object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


def _ids(ds: pqloader.ParquetDataset) -> list[int]:
    loader = pqloader.DataLoader(ds, batch_size=100, num_workers=0)
    return sorted(int(i) for b in loader for i in b["id"])


def test_folders_that_are_links_are_read_once(tmp_path: Path) -> None:
    _write(tmp_path / "runs" / "a" / "part-0.parquet", id=[1, 2])
    _write(tmp_path / "runs" / "b" / "part-0.parquet", id=[3, 4])
    root = tmp_path / "ds"
    _write(root / "local.parquet", id=[0])
    os.symlink(tmp_path / "runs" / "a", root / "run1")
    os.symlink(tmp_path / "runs" / "b", root / "run2")
    os.symlink(root, root / "run2-again")  # a loop back up: followed once
    assert _ids(pqloader.ParquetDataset(root)) == [0, 1, 2, 3, 4]


def test_files_that_are_links_to_one_file_are_read_once(tmp_path: Path) -> None:
    """As two links to one folder are (their rows came twice an epoch: found in review); a
    list naming one file twice stays refused."""
    root = tmp_path / "ds"
    _write(root / "a.parquet", id=[1, 2])
    os.symlink(root / "a.parquet", root / "b.parquet")
    _write(tmp_path / "runs" / "c.parquet", id=[3])
    os.symlink(tmp_path / "runs" / "c.parquet", root / "c.parquet")
    os.symlink(tmp_path / "runs" / "c.parquet", root / "d.parquet")
    for source in (root, f"{root}/*.parquet", f"{root}/**"):
        assert _ids(pqloader.ParquetDataset(source)) == [1, 2, 3], source
    with pytest.raises(pqloader.InvalidArgumentError, match="twice"):
        pqloader.ParquetDataset([root / "a.parquet", root / "b.parquet"])


def test_each_file_once_resolves_paths_as_realpath_does(tmp_path: Path) -> None:
    """``_each_once`` resolves a file that is no link through its folder's real path, once a
    folder (``realpath`` of every file cost most of a glob of 20,000 files): the same paths
    as ``os.path.realpath`` for links of every kind, relative and chained, broken, looping,
    to folders, and paths through ``..`` and linked folders."""
    from pqloader._sources import _each_once, _real

    (tmp_path / "real" / "sub").mkdir(parents=True)
    for name in ("a.parquet", "b.parquet", "sub/c.parquet"):
        (tmp_path / "real" / name).write_bytes(b"x")
    links = tmp_path / "links"
    links.mkdir()
    os.symlink(tmp_path / "real", links / "folder")  # absolute, to a folder
    os.symlink("../real/sub", links / "relsub")  # relative, to a folder
    os.symlink("../real/a.parquet", links / "rel.parquet")
    os.symlink(links / "rel.parquet", links / "chain.parquet")  # a link to a link
    os.symlink(tmp_path / "gone.parquet", links / "broken.parquet")
    os.symlink(links / "loop.parquet", links / "loop.parquet")
    os.symlink("folder/sub/c.parquet", links / "through.parquet")  # via a linked folder
    paths = [str(p) for p in (tmp_path / "real").rglob("*")]
    paths += [str(p) for p in links.iterdir()]
    paths += [f"{links}/folder/a.parquet", f"{links}/folder/sub/c.parquet",
              f"{links}/relsub/c.parquet", f"{links}/relsub/../b.parquet",
              f"{tmp_path}/real/sub/../a.parquet", f"{links}/folder/missing.parquet",
              f"{tmp_path}/nowhere/x.parquet", f"{links}/folder/", f"{links}/folder/."]
    folders: dict[str, str] = {}
    for path in paths + paths[::-1]:
        assert _real(path, folders) == os.path.realpath(path), path
    here = os.getcwd()
    try:
        os.chdir(links)
        for path in ("rel.parquet", "folder/b.parquet", "relsub/c.parquet", "x.parquet"):
            assert _real(path, {}) == os.path.realpath(path), path
    finally:
        os.chdir(here)
    kept = [str(p) for p in _each_once(paths)]
    expected, seen = [], set()
    for path in paths:
        if os.path.realpath(path) not in seen:
            seen.add(os.path.realpath(path))
            expected.append(str(Path(path)))
    assert kept == expected


def test_a_glob_reads_the_folders_it_matches(tmp_path: Path) -> None:
    """Spark's ``df.write.parquet("out/b.parquet")`` makes a folder: a glob matching it left
    its rows out, silently (found in review); hidden names in it stay skipped."""
    _write(tmp_path / "out" / "a.parquet", id=[1, 2])
    _write(tmp_path / "out" / "b.parquet" / "part-0.parquet", id=[3, 4, 5])
    (tmp_path / "out" / "b.parquet" / "_SUCCESS").write_text("")
    _write(tmp_path / "out" / "b.parquet" / "_temporary" / "0" / "part-0.parquet", id=[3])
    assert _ids(pqloader.ParquetDataset(f"{tmp_path}/out/*.parquet")) == [1, 2, 3, 4, 5]
    assert _ids(pqloader.ParquetDataset(f"{tmp_path}/out/**")) == [1, 2, 3, 4, 5]


def test_a_folder_named_with_brackets_is_a_folder_not_a_glob(tmp_path: Path) -> None:
    _write(tmp_path / "exp[1]" / "a.parquet", id=[7, 8])
    assert len(pqloader.ParquetDataset(tmp_path / "exp[1]")) == 2
    assert len(pqloader.ParquetDataset(tmp_path / "exp[1]" / "a.parquet")) == 2


def test_a_recursive_glob_skips_what_opening_the_folder_skips(tmp_path: Path) -> None:
    _write(tmp_path / "part-0.parquet", id=[1, 2])
    _write(tmp_path / "_temporary" / "0" / "part-0.parquet", id=[1, 2])  # Spark's leftovers
    _write(tmp_path / ".hidden" / "part-0.parquet", id=[1, 2])
    assert len(pqloader.ParquetDataset(tmp_path)) == 2
    assert len(pqloader.ParquetDataset(f"{tmp_path}/**/*.parquet")) == 2
    # named outright, a hidden folder is read: the user asked for it
    assert len(pqloader.ParquetDataset(f"{tmp_path}/_temporary/*/*.parquet")) == 2


@pytest.mark.parametrize("columns", [[], [1], "id"])
def test_columns_must_name_columns(tmp_path: Path, columns: object) -> None:
    _write(tmp_path / "a.parquet", id=[1])
    with pytest.raises(pqloader.InvalidArgumentError, match="columns"):
        pqloader.ParquetDataset(tmp_path, columns=columns)  # type: ignore[arg-type]


def test_a_hive_folder_shadowing_a_file_column_is_an_error_even_when_projected(
        tmp_path: Path) -> None:
    _write(tmp_path / "year=2020" / "a.parquet", year=[1999], x=[1])
    for columns in (None, ["year", "x"], ["x"]):
        with pytest.raises(pqloader.SchemaMismatchError, match="'year' is both"):
            pqloader.ParquetDataset(tmp_path, columns=columns)


def test_a_column_not_null_in_one_file_and_nullable_in_another(tmp_path: Path) -> None:
    strict = pa.schema([pa.field("x", pa.float64(), nullable=False)])
    pq.write_table(pa.table({"x": [1.0, 2.0]}, schema=strict), tmp_path / "a.parquet")
    _write(tmp_path / "b.parquet", x=[None, 3.0])
    ds = pqloader.ParquetDataset(tmp_path)
    assert ds.schema.field("x").nullable
    assert ds[2] == {"x": None}
    batch = next(iter(pqloader.DataLoader(ds, batch_size=4, num_workers=0)))
    assert batch["x"].isnan().tolist() == [False, False, True, False]


def test_files_alike_share_their_schema_work_and_files_unlike_do_not(tmp_path: Path) -> None:
    """Opening works out a footer's schema once for a run of files that share it (a wide
    table's open took 2.4 s for 200 files); a file whose Parquet schema is the same but whose
    Arrow schema is not (a dictionary column, said in the metadata pyarrow writes) is its own,
    and so is a column nullable or wider in a later file of a run."""
    from pqloader._sizes import leaves_of

    categories = pa.array(["a", "b"]).dictionary_encode()
    pq.write_table(pa.table({"s": categories, "x": [1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"s": ["c", "d"], "x": [3, 4]}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"s": categories, "x": [5, 6]}), tmp_path / "c.parquet")
    a, b, c = (pq.read_metadata(tmp_path / f"{n}.parquet") for n in "abc")
    assert pa.types.is_dictionary(leaves_of(a).arrow.field("s").type)
    assert leaves_of(b).arrow.field("s").type == pa.string()
    assert pa.types.is_dictionary(leaves_of(c).arrow.field("s").type)
    assert leaves_of(c) is leaves_of(c) and leaves_of(c).owners == ("s", "x")
    strict = pa.schema([pa.field("x", pa.int32(), nullable=False)])
    for n in range(3):  # a run of files alike, then one nullable, then one wider
        pq.write_table(pa.table({"x": [n]}, schema=strict), tmp_path / f"d{n}.parquet")
    _write(tmp_path / "d3.parquet", x=[None])
    pq.write_table(pa.table({"x": pa.array([4], pa.int64())}), tmp_path / "d4.parquet")
    ds = pqloader.ParquetDataset(sorted(tmp_path.glob("d*.parquet")))
    assert ds.schema.field("x").nullable and ds.schema.field("x").type == pa.int64()
    assert [ds[i]["x"] for i in range(5)] == [0, 1, 2, None, 4]
    # Parquet schemas alike but for a struct or list column's name (no Arrow schema written:
    # ParquetSchema.equals compares leaves alone): the second file's values read as nulls
    nested = tmp_path / "nested"
    nested.mkdir()
    pq.write_table(pa.table({"s": [{"t": {"x": 1}}], "y": [1]}), nested / "f1.parquet",
                   store_schema=False)
    pq.write_table(pa.table({"s": [{"u": {"x": 2}}], "y": [2]}), nested / "f2.parquet",
                   store_schema=False)
    with pytest.raises(pqloader.SchemaMismatchError, match="struct<u: struct<x: int64>> in"):
        pqloader.ParquetDataset(nested)
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    pq.write_table(pa.table({"a": [[1]]}), renamed / "f1.parquet", store_schema=False)
    pq.write_table(pa.table({"b": [[2]]}), renamed / "f2.parquet", store_schema=False)
    with pytest.raises(pqloader.SchemaMismatchError, match="has column 'b' that"):
        pqloader.ParquetDataset(renamed)
    odd = tmp_path / "odd"  # a name whose newline prints like another column's node
    odd.mkdir()
    pq.write_table(pa.table({"a": [1], "b": [2]}), odd / "f1.parquet", store_schema=False)
    pq.write_table(pa.table({"a;\n  optional int64 field_id=-1 b": [3]}), odd / "f2.parquet",
                   store_schema=False)
    with pytest.raises(pqloader.SchemaMismatchError, match="lacks"):
        pqloader.ParquetDataset(odd)


def test_a_file_rewritten_under_its_manifest_is_an_error_not_wrong_rows(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    pqloader.write_dataset(pa.table({"a": list(range(100))}), root, rows_per_file=50,
                           row_group_size=50)
    shard = sorted(root.glob("part-*.parquet"))[1]
    size = shard.stat().st_size
    # write_dataset's settings (checksums): the same values under another name, the same size
    pq.write_table(pa.table({"b": list(range(50, 100))}), shard, write_page_checksum=True)
    assert shard.stat().st_size == size
    ds = pqloader.ParquetDataset(root)  # the manifest still matches by name and size
    with pytest.raises(pqloader.SchemaMismatchError, match=rf"{shard.name} has no column 'a'"):
        ds[60]
    with pytest.raises(pqloader.SchemaMismatchError, match="manifest"):
        list(pqloader.DataLoader(ds, batch_size=10, num_workers=0))


def _rewrite_at_size(path: Path, values: np.ndarray, size: int) -> None:
    """Column ``a`` of ``values`` written over ``path`` at ``size`` bytes: padded by schema
    metadata, statistics or not, and fewer distinct values (the dictionary page shrinks)."""
    for dup, pad, stats in itertools.product(range(len(values) // 2), range(32), (True, False)):
        v = values.copy()
        v[len(v) - dup:] = v[0]
        meta = {"pad": "x" * pad} if pad else None
        pq.write_table(pa.table({"a": v}).replace_schema_metadata(meta), path,
                       write_page_checksum=True, write_statistics=stats)
        if path.stat().st_size == size:
            return
    raise AssertionError(f"no padding gives {size} bytes")


@pytest.mark.parametrize("same_size", [False, True])
def test_a_file_replaced_under_its_manifest_with_other_types_is_an_error(
        tmp_path: Path, same_size: bool) -> None:
    """Its values were read into the dataset's type: strings parsed as ints, floats cast."""
    root = tmp_path / "ds"
    pqloader.write_dataset(pa.table({"a": list(range(100))}), root, rows_per_file=50,
                           row_group_size=50)
    ds = pqloader.ParquetDataset(root)  # from the manifest: no footer read yet
    shard = sorted(root.glob("part-*.parquet"))[1]
    if same_size:
        _rewrite_at_size(shard, np.arange(50, 100, dtype=np.float64), shard.stat().st_size)
        message = rf"{shard.name}: column 'a' is double, the dataset's int64"
    else:
        pq.write_table(pa.table({"a": [str(-i) for i in range(50)]}), shard)
        message = rf"{shard.name} is [0-9,]+ bytes, [0-9,]+ when the dataset was opened"
    with pytest.raises(pqloader.SchemaMismatchError, match=message):
        list(pqloader.DataLoader(ds, batch_size=10, num_workers=0))


@pytest.mark.parametrize("manifest", [True, False])
@pytest.mark.parametrize("how", ["overwritten", "rewritten in place"])
def test_a_file_replaced_at_the_same_size_after_opening_is_an_error_not_mixed_rows(
        tmp_path: Path, manifest: bool, how: str) -> None:
    """Same size, row groups and types: its new rows were read beside the others' old ones
    without a word (found in review)."""
    root = tmp_path / "ds"
    pqloader.write_dataset(pa.table({"a": np.arange(300)}), root, rows_per_file=100,
                           compression="none")
    if not manifest:
        (root / "_pqloader_manifest.json").unlink()
    ds = pqloader.ParquetDataset(root)
    assert ds.__getitems__([0]) == [{"a": 0}]  # a file read before, and others not yet
    shard = sorted(root.glob("part-*.parquet"))[1]
    size = shard.stat().st_size
    new = pa.table({"a": np.arange(10_000, 10_300)})
    if how == "overwritten":  # new files renamed into place
        pqloader.write_dataset(new, root, rows_per_file=100, compression="none",
                               overwrite=True)
    else:  # the same file (inode), its bytes written over
        pqloader.write_dataset(new, tmp_path / "new", rows_per_file=100, compression="none")
        time.sleep(0.05)  # mtimes move in the kernel's coarse ticks (a few ms)
        shard.write_bytes((tmp_path / "new" / shard.name).read_bytes())
    assert shard.stat().st_size == size
    replaced = r"part-0000[0-2].parquet was replaced or rewritten since the dataset was opened"
    with pytest.raises(pqloader.SchemaMismatchError, match=replaced):
        ds.__getitems__(range(300))
    with pytest.raises(pqloader.SchemaMismatchError, match=replaced):
        list(pqloader.DataLoader(ds, batch_size=50, num_workers=0))
    assert len(pqloader.ParquetDataset(root).__getitems__(range(300))) == 300  # opened again


def test_a_dataset_unpickled_on_another_machine_is_not_checked_against_its_inodes(
        tmp_path: Path) -> None:
    """Sent to a machine that holds its own copy at the same path (broadcast_object_list,
    Ray), where every inode differs: read there, not refused (found in review)."""
    root = tmp_path / "ds"
    pqloader.write_dataset(pa.table({"a": np.arange(300)}), root, rows_per_file=100)
    blob = pickle.dumps(pqloader.ParquetDataset(root))
    shutil.copytree(root, tmp_path / "copy", copy_function=shutil.copy2)
    shutil.rmtree(root)
    (tmp_path / "copy").rename(root)  # the same bytes and mtimes, other inodes
    with pytest.raises(pqloader.SchemaMismatchError, match="replaced or rewritten"):
        pickle.loads(blob)[150]  # this machine: its files were replaced
    script = ("import pickle, sys\n"
              "from pqloader import _stamps\n"
              "_stamps._MACHINE = 'another machine'\n"
              "ds = pickle.loads(sys.stdin.buffer.read())\n"
              "print(sum(r['a'] for r in ds.__getitems__(range(300))))\n")
    done = subprocess.run([sys.executable, "-c", script], input=blob, capture_output=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().strip() == str(sum(range(300)))


@pytest.mark.parametrize("source", ["ds", "ds/*.parquet", ["ds/part-00000.parquet",
                                                          "ds/part-00001.parquet"]])
def test_a_dataset_opened_by_a_relative_path_reads_after_the_working_folder_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: Any) -> None:
    monkeypatch.chdir(tmp_path)
    pqloader.write_dataset(pa.table({"a": np.arange(100)}), "ds", rows_per_file=50)
    ds = pqloader.ParquetDataset(source)
    monkeypatch.chdir("/")  # as some launchers do after the dataset is opened
    assert [r["a"] for r in ds.__getitems__(range(100))] == list(range(100))
    assert sum(len(b["a"]) for b in pqloader.DataLoader(ds, batch_size=10)) == 100


def test_a_file_deleted_after_opening_is_not_found(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    pqloader.write_dataset(pa.table({"a": list(range(100))}), root, rows_per_file=50)
    for manifest in (True, False):
        if not manifest:
            (root / "_pqloader_manifest.json").unlink()
            pqloader.write_dataset(pa.table({"a": list(range(100))}), root, rows_per_file=50,
                                   overwrite=True)
            (root / "_pqloader_manifest.json").unlink()
        ds = pqloader.ParquetDataset(root)
        shard = sorted(root.glob("part-*.parquet"))[0]
        shard.unlink()
        with pytest.raises(FileNotFoundError, match=rf"{shard.name}: the file is gone"):
            ds[0]


def test_a_row_group_with_other_rows_than_indexed_is_an_error(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    pqloader.write_dataset(pa.table({"a": list(range(100))}), root, rows_per_file=50,
                           row_group_size=50)
    ds = pqloader.ParquetDataset(root)
    shard = sorted(root.glob("part-*.parquet"))[0]
    # changed after opening, at the same size (another size is told before any read)
    _rewrite_at_size(shard, np.arange(49), shard.stat().st_size)
    with pytest.raises(pqloader.SchemaMismatchError,
                       match=r"holds 49 rows, 50 when the dataset was opened"):
        list(pqloader.DataLoader(ds, batch_size=10, num_workers=0))  # (its footer, read then)


def test_a_file_listed_twice_is_an_error_not_rows_twice(tmp_path: Path) -> None:
    _write(tmp_path / "ds" / "a.parquet", id=[1, 2])
    _write(tmp_path / "ds" / "b.parquet", id=[3])
    a = tmp_path / "ds" / "a.parquet"
    for source in ([a, a], [tmp_path / "ds", a]):
        with pytest.raises(pqloader.InvalidArgumentError, match="twice"):
            pqloader.ParquetDataset(source)
