"""Damaged or odd inputs met on opening and resuming: a manifest that is not what it should
be, a state edited by hand, a column whose name holds a dot. Each is refused by name, or
worked around with a warning; never a crash deep inside, never wrong sizes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from pqloader._sizes import row_bytes

MANIFEST = "_pqloader_manifest.json"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "ds"
    pqloader.write_dataset(pa.table({"id": list(range(100))}), path, rows_per_file=50,
                           row_group_size=25)
    return path


def _edit(body: dict[str, Any], case: str) -> Any:
    entry = body["files"][0]
    if case == "array":
        return [body]
    if case == "null":
        return None
    if case == "no size":
        del entry["size"]
    elif case == "no rows":
        del entry["rows"]
    elif case == "rows and bytes differ":
        entry["rows"] = entry["rows"][:1]
    elif case == "a float count":
        entry["rows"][0] = 25.0
    return body


@pytest.mark.parametrize("case", ["array", "null", "no size", "no rows",
                                  "rows and bytes differ", "a float count", "bad utf-8"])
def test_a_damaged_manifest_warns_and_reads_the_footers(root: Path, case: str) -> None:
    file = root / MANIFEST
    if case == "bad utf-8":
        file.write_bytes(b"\xff\xfe" + file.read_bytes())
    else:
        file.write_text(json.dumps(_edit(json.loads(file.read_text()), case)))
    with pytest.warns(UserWarning, match="manifest"):
        ds = pqloader.ParquetDataset(root)
    loader = pqloader.DataLoader(ds, batch_size=30, num_workers=0)
    assert sorted(int(i) for b in loader for i in b["id"]) == list(range(100))


@pytest.mark.parametrize(("path", "value", "named"), [
    (["settings", "batch_size"], 0, "settings.batch_size"),
    (["settings", "batch_size"], 4.5, "settings.batch_size"),
    (["settings", "world_size"], 0, "settings.world_size"),
    (["settings", "num_workers"], -1, "settings.num_workers"),
    (["settings", "shuffle_window_rows"], -5, "settings.shuffle_window_rows"),
    (["dataset"], None, "dataset"),
    (["batches"], True, "batches"),
    (["resumed_from"], {"settings": {}, "batches": 0}, "resumed_from.settings"),
])
def test_a_damaged_state_is_refused_by_name(root: Path, path: list[str], value: Any,
                                            named: str) -> None:
    ds = pqloader.ParquetDataset(root)
    loader = pqloader.DataLoader(ds, batch_size=10, shuffle=True, num_workers=0)
    it = iter(loader)
    next(it)
    state = copy.deepcopy(loader.state_dict())
    target = state
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    fresh = pqloader.DataLoader(ds, batch_size=10, shuffle=True, num_workers=0)
    with pytest.raises(pqloader.StateMismatchError, match=named.replace(".", r"\.")):
        fresh.load_state_dict(state)


def _resumed_state(ds: pqloader.ParquetDataset) -> dict[str, Any]:
    """A state of an epoch resumed under another batch size: it holds a resumed_from."""
    first = pqloader.DataLoader(ds, batch_size=10, shuffle=True, num_workers=0)
    it = iter(first)
    for _ in range(3):
        next(it)
    second = pqloader.DataLoader(ds, batch_size=7, shuffle=True, num_workers=0)
    second.load_state_dict(first.state_dict())
    it = iter(second)
    next(it)
    state = copy.deepcopy(second.state_dict())
    assert state["resumed_from"]["batches"] == 3
    return state


@pytest.mark.parametrize(("key", "value", "named"), [
    ("seed", 99, r"resumed_from\.settings\.seed=99 differs"),  # lost 93 rows of 1,000
    ("shuffle", False, r"resumed_from\.settings\.shuffle=False differs"),
    ("batches", 10**6, r"resumed_from\.batches=1000000 .*past its plan's"),  # lost 880
    ("chain", 400, r"resumed_from chain is over 100"),  # was a RecursionError
])
def test_a_damaged_resumed_from_is_refused_by_name(root: Path, key: str, value: Any,
                                                   named: str) -> None:
    ds = pqloader.ParquetDataset(root)
    state = _resumed_state(ds)
    if key == "batches":
        state["resumed_from"]["batches"] = value
    elif key == "chain":
        for _ in range(value):
            state["resumed_from"] = {**copy.deepcopy(state["resumed_from"]),
                                     "resumed_from": state["resumed_from"]}
    else:
        state["resumed_from"]["settings"][key] = value
    fresh = pqloader.DataLoader(ds, batch_size=7, shuffle=True, num_workers=0)
    with pytest.raises(pqloader.StateMismatchError, match=named):
        fresh.load_state_dict(state)
    fresh.load_state_dict(_resumed_state(ds))  # undamaged: restored


def test_len_is_the_whole_epoch_after_an_exact_or_an_elastic_resume(root: Path) -> None:
    ds = pqloader.ParquetDataset(root)
    loader = pqloader.DataLoader(ds, batch_size=10, num_workers=2)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    for workers in (2, 3):  # the same settings, or other ones (elastic)
        again = pqloader.DataLoader(ds, batch_size=10, num_workers=workers)
        again.load_state_dict(state)
        assert len(again) == len(loader) == 10
        assert sum(1 for _ in again) == 6
    smaller = pqloader.DataLoader(ds, batch_size=7, num_workers=0)
    smaller.load_state_dict(state)
    assert len(smaller) == 4 + 9  # 40 rows before; the 60 left in batches of 7
    assert sum(1 for _ in smaller) == 9
    smaller.set_epoch(1)
    assert len(smaller) == 15  # the next epoch: whole, in batches of 7


def test_a_column_named_with_a_dot_is_sized_as_itself(tmp_path: Path) -> None:
    vectors = pa.array([[1.0] * 128] * 1000, pa.list_(pa.float64(), 128))
    pq.write_table(pa.table({"emb.vec": vectors, "id": list(range(1000))}), tmp_path / "a.pq")
    sizes = row_bytes(pq.read_metadata(tmp_path / "a.pq"))
    assert sizes is not None and set(sizes) == {"emb.vec", "id"}
    assert sizes["emb.vec"] == pytest.approx(1024, rel=0.01)


def _footer_chunk_type_changed(path: Path) -> None:
    """``path``'s footer with row group 1's INT32 column chunk saying INT64: in Thrift's compact
    form a chunk's ColumnMetaData opens with its type (field 1, i32: 0x15, then INT32 as
    zigzag 0x02) and its encodings (field 2, a list: 0x19)."""
    data = bytearray(path.read_bytes())
    length = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - length
    found = [start + i for i in range(length - 2)
             if data[start + i:start + i + 3] == b"\x15\x02\x19"]
    assert len(found) == 4, found  # the INT32 column's chunk in each row group
    data[found[1] + 1] = 0x04  # INT64
    path.write_bytes(bytes(data))


def test_a_footer_whose_chunk_type_is_not_its_columns_aborts_nothing(tmp_path: Path) -> None:
    """A damaged footer: a column chunk of another physical type than its column. Reading its
    statistics (for a column's nulls, as a loader is built) aborted the process: pyarrow
    throws a C++ exception nothing catches (found by fuzzing). Its row group read alone is a
    CorruptFileError naming the file; the loader reads the rows (their pages are right)."""
    import subprocess
    import sys
    import textwrap

    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": pa.array(range(1000), pa.int64()),
                             "i32": pa.array(range(1000), pa.int32())}), path,
                   row_group_size=250)
    _footer_chunk_type_changed(path)
    with pytest.raises(pqloader.CorruptFileError, match=r"a\.parquet: row group 1 does not "):
        pqloader.ParquetDataset(path)[300]
    code = textwrap.dedent(f"""
        import pqloader
        ds = pqloader.ParquetDataset({str(path)!r})
        rows = [(int(i), int(v)) for b in pqloader.DataLoader(ds, batch_size=64, shuffle=True)
                for i, v in zip(b["id"], b["i32"])]
        assert sorted(rows) == [(i, i) for i in range(1000)]
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_text_that_is_not_utf8_is_named_by_file_row_group_and_column(tmp_path: Path) -> None:
    """A damaged string page (or bytes written as strings) raised a bare UnicodeDecodeError
    from ds[i] and from a batch: no file, row group or column (found by fuzzing)."""
    import numpy as np

    offsets = np.array([0, 2, 3, 5], np.int32)  # the second value is the byte 0x99
    text = pa.Array.from_buffers(pa.string(), 3, [None, pa.py_buffer(offsets.tobytes()),
                                                  pa.py_buffer(b"ab\x99cd")])
    pq.write_table(pa.table({"id": [0, 1, 2], "s": text}), tmp_path / "a.parquet")
    ds = pqloader.ParquetDataset(tmp_path)
    said = r"column 's' holds text that is not UTF-8 \(invalid start byte at byte 0 of a value\)"
    with pytest.raises(pqloader.CorruptFileError, match=r"a\.parquet: row group 0: " + said):
        ds[1]
    for workers in (0, 2):
        with pytest.raises(pqloader.CorruptFileError, match=said) as info:
            list(pqloader.DataLoader(ds, batch_size=3, num_workers=workers))
        assert any("a.parquet: row group 0" in note for note in info.value.__notes__)


@pytest.mark.parametrize("workers", [0, 2])
def test_text_that_is_not_utf8_in_a_batch_of_many_row_groups_names_its_own(
        tmp_path: Path, workers: int) -> None:
    """A shuffled batch mixes many row groups: the note named the batch's first 8 "and 120
    row groups more", not the one holding the bad text (found by fuzzing)."""
    import numpy as np

    for f in range(8):
        values = [f"row {i}".encode() for i in range(500)]
        if f == 5:
            values[433] = b"\xff\xfe bad"  # row group 8 of 10
        raw = pa.array(values, pa.binary())
        text = pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())  # unvalidated
        pq.write_table(pa.table({"id": np.arange(500) + 500 * f, "s": text}),
                       tmp_path / f"part-{f}.parquet", row_group_size=50)
    loader = pqloader.DataLoader(pqloader.ParquetDataset(tmp_path), batch_size=1024,
                                 shuffle=True, seed=0, num_workers=workers)
    with pytest.raises(pqloader.CorruptFileError, match="not UTF-8") as info:
        list(loader)
    (note,) = (n for n in info.value.__notes__ if "row group" in n)
    assert note.endswith(f"; it is from {tmp_path / 'part-5.parquet'}: row group 8"), note


def test_a_file_the_manifest_lists_that_is_missing_is_an_error(tmp_path: Path) -> None:
    """It was warned of, and the footers read: an epoch 1,000 rows short (found by fuzzing)."""
    pqloader.write_dataset(pa.table({"id": list(range(3000))}), tmp_path, rows_per_file=1000)
    (tmp_path / "part-00001.parquet").unlink()
    with pytest.raises(pqloader.CorruptFileError, match=r"lists part-00001\.parquet, missing "
                       r"\(1,000 rows\).*delete the manifest to read the files"):
        pqloader.ParquetDataset(tmp_path)
    (tmp_path / MANIFEST).unlink()
    assert len(pqloader.ParquetDataset(tmp_path)) == 2000


def test_a_footer_whose_row_groups_do_not_add_up_is_refused(tmp_path: Path) -> None:
    """A row group's count lowered in a footer (the file's total and the pages left as they
    were): its rows went missing silently (found by fuzzing)."""
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": list(range(1000))}), path, row_group_size=250)
    data = bytearray(path.read_bytes())
    length = int.from_bytes(data[-8:-4], "little")
    footer = bytes(data[len(data) - 8 - length:len(data) - 8])
    # RowGroup.num_rows (field 3, i64: 0x16) of 250 (zigzag 500: 0xf4 0x03), then its
    # file_offset (field 5: 0x26); a column's num_values of 250 is followed by another i64
    at = footer.index(b"\x16\xf4\x03\x26", footer.index(b"\x16\xf4\x03\x26") + 1)
    data[len(data) - 8 - length + at + 1] = 0xf0  # 248
    path.write_bytes(bytes(data))
    assert pq.read_metadata(path).row_group(1).num_rows == 248
    with pytest.raises(pqloader.CorruptFileError, match=r"a\.parquet: its footer counts 1,000 "
                       r"rows, its row groups 998"):
        pqloader.ParquetDataset(path)


def test_a_manifest_whose_rows_are_not_the_footers_is_told_at_the_read(tmp_path: Path) -> None:
    """A manifest's count of a row group lowered, or a row group left out: the footer read
    later disagreed unseen, and those rows went missing (found by fuzzing)."""
    pqloader.write_dataset(pa.table({"id": list(range(1000))}), tmp_path, rows_per_file=500,
                           row_group_size=250)
    body = json.loads((tmp_path / MANIFEST).read_text())
    body["files"][1]["rows"][0] = 0  # a row group of none: left out of the index
    (tmp_path / MANIFEST).write_text(json.dumps(body))
    ds = pqloader.ParquetDataset(tmp_path)
    assert len(ds) == 750
    with pytest.raises(pqloader.SchemaMismatchError, match=r"part-00001\.parquet: row group 0 "
                       r"holds 250 rows, 0 when the dataset was opened"):
        list(pqloader.DataLoader(ds, batch_size=100))
