"""Files and folders a dataset cannot read for no fault of their bytes: a folder or file this
process may not read, a named pipe, a broken symbolic link, a loop of links. Each is refused
by name, saying what it is; none is skipped (half a dataset's rows were read, no word), none
hangs (a named pipe blocked the open forever), none is told as a corrupt file."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import pqloader


def _two_parts(root: Path, *, manifest: bool = True) -> Path:
    for part in ("a", "b"):
        pqloader.write_dataset(pa.table({"id": list(range(100))}), root / f"part={part}",
                               rows_per_file=100)
        if not manifest:
            (root / f"part={part}" / "_pqloader_manifest.json").unlink()
    return root


def _as_reader_without_rights(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` where mode bits apply: as this user, or as root without the capabilities
    that read past them (``setpriv``: root reads a folder of mode 000)."""
    argv = [sys.executable, "-c", textwrap.dedent(code)]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("needs setpriv (util-linux) to read as root without its rights")
        caps = "-dac_override,-dac_read_search,-fowner"
        argv = ["setpriv", "--bounding-set", caps, "--inh-caps", caps, *argv]
    src = str(Path(pqloader.__file__).parent.parent)
    return subprocess.run(argv, capture_output=True, text=True, timeout=100,
                          env={**os.environ, "PYTHONPATH": src})


def _count_while(path: Path, mode: int, source: Path | str) -> str:
    """What a reader without rights gets of ``source`` (its rows, or its error) while
    ``path`` has mode ``mode`` (restored to 755, files' to 644, after)."""
    restore = 0o755 if path.is_dir() else 0o644
    path.chmod(mode)
    try:
        done = _as_reader_without_rights(_COUNT.format(source=str(source)))
    finally:
        path.chmod(restore)
    return done.stdout + done.stderr


_COUNT = """
import sys, pqloader
try:
    ds = pqloader.ParquetDataset(sys.argv[1] if len(sys.argv) > 1 else {source!r})
    print("rows", sum(len(b["id"]) for b in pqloader.DataLoader(ds, batch_size=64)))
except pqloader.PQLoaderError as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.parametrize("glob", [False, True], ids=["folder", "glob"])
def test_a_folder_that_cannot_be_listed_is_refused_not_skipped(tmp_path: Path,
                                                               glob: bool) -> None:
    root = _two_parts(tmp_path / "ds")
    told = _count_while(root / "part=b", 0, root / "**" / "*.parquet" if glob else root)
    assert told.startswith(f"PermissionDeniedError {root / 'part=b'}: permission denied"), \
        told  # was: rows 100


def test_a_dataset_folder_that_cannot_be_listed_is_no_empty_dataset(tmp_path: Path) -> None:
    root = _two_parts(tmp_path / "ds")
    told = _count_while(root, 0, root)
    assert told.startswith(f"PermissionDeniedError {root}: permission denied"), \
        told  # was: "the directory holds no data file"


@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "footers"])
def test_a_file_that_may_not_be_read_is_no_corrupt_file(tmp_path: Path, manifest: bool) -> None:
    root = _two_parts(tmp_path / "ds", manifest=manifest)
    (file,) = (root / "part=b").glob("*.parquet")
    told = _count_while(file, 0, root)
    # was: "not a readable Parquet file ... remove it" (footers), "does not decode ... the
    # file is corrupt or truncated" (manifest: read at the row group)
    assert told.startswith(f"PermissionDeniedError {file}: permission denied"), told


def test_a_csv_that_may_not_be_read_is_said_so(tmp_path: Path) -> None:
    csv = tmp_path / "rows.csv"
    csv.write_text("a,b\n1,2\n")
    csv.chmod(0)
    try:
        done = _as_reader_without_rights(f"""
            import sys
            from pqloader._cli import main
            sys.exit(main(["write", {str(csv)!r}, {str(tmp_path / "out")!r}]))
        """)
    finally:
        csv.chmod(0o644)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{csv}: permission denied" in done.stderr
    assert "guessed" not in done.stderr  # was: "make later values fit them"


@pytest.mark.parametrize("how", ["folder", "glob", "file", "manifest"])
def test_a_named_pipe_is_refused_not_waited_on(tmp_path: Path, how: str) -> None:
    root = _two_parts(tmp_path / "ds", manifest=how == "manifest")
    pipe = root / "part=a" / "part-99999.parquet"
    os.mkfifo(pipe)
    source = {"folder": root, "manifest": root, "glob": root / "*" / "*.parquet",
              "file": pipe}[how]
    with pytest.raises(pqloader.CorruptFileError, match="a named pipe"):
        pqloader.ParquetDataset(source)
    if how != "file":  # (a manifest never lists a file of size 0, as a pipe's is)
        with pytest.warns(UserWarning, match="1 of 3 files left out"):
            assert len(pqloader.ParquetDataset(source, on_bad_file="skip")) == 200


@pytest.mark.parametrize("glob", [False, True], ids=["folder", "glob"])
def test_a_broken_link_and_a_loop_of_links_are_refused_by_name(tmp_path: Path,
                                                               glob: bool) -> None:
    root = _two_parts(tmp_path / "ds", manifest=False)
    source = root / "*" / "*.parquet" if glob else root
    broken = root / "part=a" / "z.parquet"
    broken.symlink_to(tmp_path / "gone.parquet")
    with pytest.raises(pqloader.DatasetNotFoundError,
                       match=f"{broken}: a symbolic link to .*gone.parquet.*does not exist"):
        pqloader.ParquetDataset(source)  # the glob left it out, silently
    broken.unlink()
    loop = root / "part=a" / "y.parquet"
    loop.symlink_to(loop)
    with pytest.raises(pqloader.CorruptFileError, match=f"{loop}: a loop of symbolic links"):
        pqloader.ParquetDataset(source)  # a folder raised a bare OSError; a glob left it out


def _with_bad_files(root: Path) -> dict[str, str]:
    """A dataset of 3 good files (300 rows) and bad ones beside: {name: what each is}."""
    pqloader.write_dataset(pa.table({"id": list(range(300))}), root, rows_per_file=100)
    (root / "_pqloader_manifest.json").unlink()  # judged by their footers
    good = sorted(root.glob("part-*.parquet"))[0].read_bytes()
    (root / "empty.parquet").write_bytes(b"")
    (root / "notes.parquet").write_text("not parquet at all\n")
    (root / "cut.parquet").write_bytes(good[:len(good) // 2])
    (root / "link.parquet").symlink_to(root / "gone.parquet")
    return {"empty.parquet": "too short|not a readable Parquet", "notes.parquet": "Parquet",
            "cut.parquet": "Parquet", "link.parquet": "symbolic link"}


def test_files_that_cannot_be_read_are_skipped_when_asked_and_counted(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    bad = _with_bad_files(root)
    with pytest.raises(pqloader.PQLoaderError):
        pqloader.ParquetDataset(root)  # the default: an error naming the first
    with pytest.warns(UserWarning, match=r"4 of 7 files left out \(on_bad_file='skip'\)"):
        ds = pqloader.ParquetDataset(root, on_bad_file="skip")
    assert {Path(f).name for f in ds.skipped_files} == set(bad)
    for file, why in ds.skipped_files.items():
        assert re.search(bad[Path(file).name], why), (file, why)
    assert len(ds) == 300 and "3 files (4 skipped)" in repr(ds)
    ids = [i for b in pqloader.DataLoader(ds, batch_size=64, shuffle=True, num_workers=2)
           for i in b["id"].tolist()]
    assert sorted(ids) == list(range(300))
    state = pqloader.DataLoader(ds, batch_size=64).state_dict()
    (root / "cut.parquet").write_bytes((root / "part-00000.parquet").read_bytes())  # mended
    with pytest.warns(UserWarning, match="3 of 7"):
        mended = pqloader.ParquetDataset(root, on_bad_file="skip")
    with pytest.raises(pqloader.StateMismatchError):  # other rows: not the state's dataset
        pqloader.DataLoader(mended, batch_size=64).load_state_dict(state)


def test_skipping_every_file_is_an_empty_dataset(tmp_path: Path) -> None:
    (tmp_path / "a.parquet").write_bytes(b"")
    with pytest.raises(pqloader.EmptyDatasetError,
                       match=r"every file was skipped.*size is 0 bytes"):
        pqloader.ParquetDataset(tmp_path, on_bad_file="skip")
    with pytest.raises(pqloader.InvalidArgumentError, match="on_bad_file='ignore'"):
        pqloader.ParquetDataset(tmp_path, on_bad_file="ignore")


def test_a_remote_file_that_is_not_parquet_is_skipped_when_asked(tmp_path: Path,
                                                                 nginx_files: Any) -> None:
    root = tmp_path / "ds"
    _with_bad_files(root)
    (root / "link.parquet").unlink()  # (nginx answers 404 for it: an error, not skipped)
    nginx = nginx_files(root)
    with pytest.warns(UserWarning, match="3 of 6 files left out"):
        ds = pqloader.ParquetDataset(nginx.url + "/", on_bad_file="skip")
    assert len(ds) == 300 and {Path(f).name for f in ds.skipped_files} == \
        {"empty.parquet", "notes.parquet", "cut.parquet"}


def test_a_glob_passes_through_a_folder_it_may_enter_but_not_list(tmp_path: Path) -> None:
    """``/home/*/data/*.parquet`` with home folders of mode 711: the wildcard lists /home,
    not the home folders, so they need not be listable (found in review of the check)."""
    for name, ids in (("alice", [0, 1, 2]), ("bob", [3, 4])):
        pqloader.write_dataset(pa.table({"id": ids}), tmp_path / name / "data")
    (tmp_path / "lost+found").mkdir(mode=0)  # a volume's: no data, never listed
    told = _count_while(tmp_path / "alice", 0o311, tmp_path / "*" / "data" / "*.parquet")
    assert told.strip() == "rows 5", told  # (0o311: enter, not list)
    for source in (tmp_path, tmp_path / "*" / "*" / "*.parquet", tmp_path / "**" / "*.parquet"):
        found = _as_reader_without_rights(_COUNT.format(source=str(source)))
        assert found.stdout.strip() == "rows 5", found.stdout + found.stderr


def test_a_double_star_glob_refuses_a_folder_deep_below_it_cannot_list(tmp_path: Path
                                                                       ) -> None:
    """The check lists the folders below a ``**`` as folders alone (it listed every file
    again, each stat'ed): a folder three levels down that cannot be listed is still refused,
    and a hidden one (no data) is never looked at."""
    for k in range(3):
        pqloader.write_dataset(pa.table({"id": [k]}), tmp_path / f"a{k}" / "b" / "c")
    (tmp_path / "a0" / ".cache").mkdir(mode=0)
    source = tmp_path / "**" / "*.parquet"
    assert _count_while(tmp_path / "a0" / ".cache", 0, source).strip() == "rows 3"
    told = _count_while(tmp_path / "a1" / "b" / "c", 0, source)
    assert told.startswith(f"PermissionDeniedError {tmp_path / 'a1' / 'b' / 'c'}"), told


def test_a_source_below_a_folder_that_may_not_be_entered_is_said_so(tmp_path: Path) -> None:
    root = _two_parts(tmp_path / "sealed" / "ds")
    told = _count_while(tmp_path / "sealed", 0o600, root)  # no x: nothing below reached
    assert told.startswith(f"PermissionDeniedError {root}: permission denied"), \
        told  # was a bare PermissionError from pathlib


def test_a_broken_link_beside_a_manifest_is_skipped_when_asked(tmp_path: Path) -> None:
    """The manifest's check of the files' sizes raised for the link before any footer was
    read, so on_bad_file="skip" could not skip it."""
    root = _two_parts(tmp_path / "ds")
    (root / "part=a" / "z.parquet").symlink_to(tmp_path / "gone.parquet")
    with pytest.raises(pqloader.DatasetNotFoundError, match="a symbolic link"):
        pqloader.ParquetDataset(root)
    with pytest.warns(UserWarning, match="1 of 3 files left out"):
        assert len(pqloader.ParquetDataset(root, on_bad_file="skip")) == 200
