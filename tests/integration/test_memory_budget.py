"""memory_budget_bytes holds the real RSS the loader adds, on a dataset several times larger."""

from __future__ import annotations

import collections
import mmap
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import pqloader
from pqloader._memory import release_unused

MIB = 2**20
ROWS = 4_000_000
BUDGET = 160 * MIB  # the dataset decodes to 4M x (16 float32 + int64) = 275 MiB


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> pqloader.ParquetDataset:
    path = tmp_path_factory.mktemp("budget") / "ds"

    def batches() -> Iterator[pa.RecordBatch]:
        rng = np.random.default_rng(0)
        for start in range(0, ROWS, 500_000):
            n = min(500_000, ROWS - start)
            cols = {f"f{i:02d}": rng.random(n, dtype=np.float32) for i in range(16)}
            yield pa.record_batch({"id": np.arange(start, start + n), **cols})

    first = next(batches())
    reader = pa.RecordBatchReader.from_batches(first.schema, batches())
    pqloader.write_dataset(reader, path, rows_per_file=1_000_000, row_group_size=32_768,
                           compression="none")
    return pqloader.ParquetDataset(path)


def _peak_added(loader: Iterable[Any]) -> tuple[int, np.ndarray]:
    """Iterate an epoch; the peak RSS it added (sampled every 2 ms) and the ids seen. The ids
    go into memory written before the epoch: kept as copies, ROWS of them were 30 MiB of a
    96 MiB budget counted against the loader (a run failed at 99 MiB)."""
    ids = np.full(ROWS, -1, dtype=np.int64)  # written now: in the RSS before the epoch
    me = psutil.Process()
    release_unused()  # as the budget does as it starts: from a base above, all added was 0
    base = me.memory_info().rss
    peak = [base]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], me.memory_info().rss)
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    n = 0
    try:
        for batch in loader:
            got = batch["id"].numpy()
            ids[n:n + len(got)] = got
            n += len(got)
    finally:
        stop.set()
        watcher.join()
    return peak[0] - base, ids[:n]


@pytest.mark.parametrize("num_workers", [0, 2, "auto"])
def test_budget_holds_real_rss_and_every_row_comes(big: pqloader.ParquetDataset,
                                                   num_workers: Any) -> None:
    loader = pqloader.DataLoader(big, batch_size=4096, shuffle=True, seed=1,
                                 num_workers=num_workers, memory_budget_bytes=BUDGET)
    added, ids = _peak_added(loader)
    assert added <= BUDGET, f"added {added / MIB:.0f} MiB over a {BUDGET / MIB:.0f} MiB budget"
    assert np.array_equal(np.sort(ids), np.arange(ROWS))
    assert ids[:10_000].max() - ids[:10_000].min() > ROWS // 2, "the first rows should mix"


def test_a_state_saved_without_a_budget_resumes_within_one(
        big: pqloader.ParquetDataset) -> None:
    """Its larger windows were read whole for the rest of the epoch (2-6x the budget); the
    same held after lowering shuffle_window_rows to resume from an out-of-memory crash."""
    others = set(threading.enumerate())  # (earlier tests' pools may live on)
    saver = pqloader.DataLoader(big, batch_size=4096, shuffle=True, seed=1, num_workers=2)
    it = iter(saver)
    head = [next(it)["id"].numpy().copy() for _ in range(40)]
    state = saver.state_dict()
    it.close()
    del it, saver
    deadline = time.monotonic() + 30  # the saver's reads ahead end, and their memory goes
    while (pa.total_allocated_bytes() > 8 * MIB or any(
            t.name.startswith("pqloader") for t in set(threading.enumerate()) - others)) \
            and time.monotonic() < deadline:  # (its thread, between two reads, then made a
        time.sleep(0.05)  # window of ~180 MiB, counted as the resumed loader's: a CI run)
    budget = 96 * MIB  # the old windows took 125-183 MiB
    loader = pqloader.DataLoader(big, batch_size=4096, shuffle=True, seed=1, num_workers=2,
                                 memory_budget_bytes=budget)
    loader.load_state_dict(state)
    saved, own = (s["settings"]["shuffle_window_rows"] for s in (state, loader.state_dict()))
    assert own < saved // 4, "the test needs windows the budget cannot hold"
    added, ids = _peak_added(loader)
    assert added <= budget, f"added {added / MIB:.0f} MiB over a {budget / MIB:.0f} MiB budget"
    assert np.array_equal(np.sort(np.concatenate([*head, ids])), np.arange(ROWS))


def test_without_a_budget_the_same_loader_takes_more(big: pqloader.ParquetDataset) -> None:
    # what makes the test above mean something: the default windows do not fit
    loader = pqloader.DataLoader(big, batch_size=4096, shuffle=True, seed=1, num_workers=2)
    added, _ = _peak_added(loader)
    assert added > BUDGET


def test_a_budget_below_one_row_group_per_window_is_refused(
        big: pqloader.ParquetDataset) -> None:
    with pytest.raises(pqloader.InvalidArgumentError,
                       match=r"memory_budget_bytes=.* row group .*with 50,331,648 "
                       r"bytes for the rest \(threads, batches, Arrow's pool\): give at least"):
        pqloader.DataLoader(big, batch_size=64, num_workers=2, memory_budget_bytes=40 * MIB)


def test_a_budget_refused_warns_of_no_window(big: pqloader.ParquetDataset) -> None:
    """Refused shuffled, it first warned of the small shuffle window the budget would leave,
    a window never used (found in review)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(pqloader.InvalidArgumentError, match="memory_budget_bytes="):
            pqloader.DataLoader(big, batch_size=64, shuffle=True, num_workers=2,
                                memory_budget_bytes=40 * MIB)
    assert [str(w.message) for w in caught] == []


@pytest.mark.parametrize("name", ["shuffle_window_rows", "batch_size"])
def test_a_window_or_batch_larger_than_the_budget_is_refused(big: pqloader.ParquetDataset,
                                                            name: str) -> None:
    """Set by hand, they were taken as given: 3-6x the budget in RSS."""
    kwargs: dict[str, Any] = {"batch_size": 64, name: len(big)}
    with pytest.raises(pqloader.InvalidArgumentError,
                       match=rf"{name}=.* more than the .* memory_budget_bytes=.*: give {name} "
                       "at most .*, a larger budget, or fewer num_workers"):
        pqloader.DataLoader(big, num_workers=2, memory_budget_bytes=BUDGET, **kwargs)
    with pytest.raises(pqloader.InvalidArgumentError) as one:  # no fewer than none
        pqloader.DataLoader(big, num_workers=0, memory_budget_bytes=BUDGET, **kwargs)
    assert "num_workers" not in str(one.value) and "or a larger budget" in str(one.value)


def test_a_budget_with_process_workers_is_refused(tmp_path: Path,
                                                  big: pqloader.ParquetDataset) -> None:
    with pytest.raises(pqloader.InvalidArgumentError, match="thread workers"):
        pqloader.DataLoader(big, batch_size=64, num_workers=2, worker_type="process",
                            memory_budget_bytes=BUDGET)


def test_to_torch_holds_the_budget_in_process(big: pqloader.ParquetDataset) -> None:
    import torch

    it = big.to_torch(batch_size=4096, shuffle=True, seed=1, memory_budget_bytes=BUDGET)
    loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=0)
    added, ids = _peak_added(loader)  # type: ignore[arg-type]
    assert added <= BUDGET, f"added {added / MIB:.0f} MiB over a {BUDGET / MIB:.0f} MiB budget"
    assert np.array_equal(np.sort(ids), np.arange(ROWS))


def test_to_torch_with_a_budget_refuses_torch_worker_processes(
        big: pqloader.ParquetDataset) -> None:
    import torch

    it = big.to_torch(batch_size=4096, memory_budget_bytes=BUDGET)
    loader = torch.utils.data.DataLoader(it, batch_size=None, num_workers=1)
    with pytest.raises(pqloader.InvalidArgumentError, match=r"one process.*num_workers=0"):
        next(iter(loader))


@pytest.mark.filterwarnings("ignore:shuffle=True permutes")  # a small budget's windows
def test_a_deep_prefetch_with_a_slow_consumer_stays_in_the_budget(
        big: pqloader.ParquetDataset) -> None:
    # the batches made ahead hold memory of their own: 64 per worker of 8,192 rows is ~75 MiB
    loader = pqloader.DataLoader(big, batch_size=8192, shuffle=True, seed=1, num_workers=2,
                                 memory_budget_bytes=BUDGET // 2, prefetch_factor=64,
                                 transform=lambda b: (time.sleep(0.001), b)[1])
    slow = ({"id": b["id"]} for b in loader if time.sleep(0.003) is None)
    added, ids = _peak_added(slow)
    assert added <= BUDGET // 2, f"added {added / MIB:.0f} MiB over {BUDGET // 2 / MIB:.0f} MiB"
    assert np.array_equal(np.sort(ids), np.arange(ROWS))


@pytest.fixture(scope="module")
def categories(tmp_path_factory: pytest.TempPathFactory) -> pqloader.ParquetDataset:
    """2M rows of dictionary-encoded category names, ~170 MiB decoded, 9 MiB in footers."""
    path = tmp_path_factory.mktemp("budget") / "categories"
    rng = np.random.default_rng(0)
    names = pa.array([f"category-{i:03d}-" + "x" * 60 for i in range(200)])

    def batches() -> Iterator[pa.RecordBatch]:
        for start in range(0, 2_000_000, 500_000):
            yield pa.record_batch({"id": np.arange(start, start + 500_000),
                                   "name": names.take(rng.integers(0, 200, 500_000))})

    first = next(batches())
    pqloader.write_dataset(pa.RecordBatchReader.from_batches(first.schema, batches()), path,
                           rows_per_file=250_000, row_group_size=25_000)
    (path / "_pqloader_manifest.json").unlink()  # the footers, as most datasets have
    return pqloader.ParquetDataset(path)


@pytest.mark.filterwarnings("ignore:shuffle=True permutes")  # a small budget's windows
def test_dictionary_encoded_strings_stay_in_the_budget(
        categories: pqloader.ParquetDataset) -> None:
    budget = 80 * MIB
    loader = pqloader.DataLoader(categories, batch_size=512, shuffle=True, num_workers=2,
                                 memory_budget_bytes=budget)
    added, ids = _peak_added(loader)
    assert added <= budget, f"added {added / MIB:.0f} MiB over {budget / MIB:.0f} MiB"
    assert np.array_equal(np.sort(ids), np.arange(2_000_000))


@pytest.mark.filterwarnings("ignore:shuffle=True permutes")  # a small budget's windows
def test_dictionary_encoded_strings_in_lists_stay_in_the_budget(tmp_path: Path) -> None:
    """Tags: lists of category names, ~160 MiB decoded; their footers count each name once a
    row group (~9x less), which made windows larger than the budget."""
    rng = np.random.default_rng(0)
    names = pa.array([f"category-{i:03d}-" + "x" * 60 for i in range(200)])

    def batches() -> Iterator[pa.RecordBatch]:
        for start in range(0, 1_000_000, 250_000):
            offsets = np.concatenate([[0], np.cumsum(rng.integers(0, 5, 250_000))])
            tags = pa.ListArray.from_arrays(offsets.astype(np.int32),
                                            names.take(rng.integers(0, 200, offsets[-1])))
            yield pa.record_batch({"id": np.arange(start, start + 250_000), "tags": tags})

    first = next(batches())
    pqloader.write_dataset(pa.RecordBatchReader.from_batches(first.schema, batches()),
                           tmp_path, rows_per_file=125_000, row_group_size=10_000)
    (tmp_path / "_pqloader_manifest.json").unlink()  # the footers, as most datasets have
    budget = 80 * MIB
    loader = pqloader.DataLoader(  # list<string> needs a collate_fn: the ids are what counts
        pqloader.ParquetDataset(tmp_path), batch_size=512, shuffle=True, num_workers=2,
        memory_budget_bytes=budget,
        collate_fn=lambda b: {"id": torch.from_numpy(b.column("id").to_numpy().copy())})
    added, ids = _peak_added(loader)
    assert added <= budget, f"added {added / MIB:.0f} MiB over {budget / MIB:.0f} MiB"
    assert np.array_equal(np.sort(ids), np.arange(1_000_000))


def test_files_of_heavy_and_light_rows_stay_in_the_budget(tmp_path: Path) -> None:
    """Labels in one file, 16 KiB texts in another: windows sized by the mean row held up
    to 10x their share of heavy rows, and the loader 2x its budget."""
    light = pa.table({"id": np.arange(1_000_000), "text": pa.array(["x"] * 1_000_000)})
    pqloader.write_dataset(light, tmp_path / "light", row_group_size=125_000)
    heavy = pa.table({"id": np.arange(1_000_000, 1_006_400),
                      "text": pa.array([f"{i:08d}" + "y" * 16_376 for i in range(6_400)])})
    pqloader.write_dataset(heavy, tmp_path / "heavy", row_group_size=128, compression="zstd")
    ds = pqloader.ParquetDataset([tmp_path / "light", tmp_path / "heavy"])
    budget = 64 * MIB
    loader = pqloader.DataLoader(
        ds, batch_size=256, shuffle=True, seed=0, num_workers=0, memory_budget_bytes=budget,
        collate_fn=lambda b: {"id": torch.from_numpy(b.column("id").to_numpy().copy())})
    added, ids = _peak_added(loader)
    # What progress needs is made anyway (the README): a heavy row group (128 rows of 16 KiB)
    # read while the room was short. Peaks were 56-63 MiB alone; 65 and 66 in CI runs beside
    # other work (budget + that row group failed at 66); the fault this test catches ran at
    # 2x the budget. Held to 1.1x, where the README's warning begins
    assert added <= 1.1 * budget, f"added {added / MIB:.0f} MiB over {budget / MIB:.0f} MiB"
    assert np.array_equal(np.sort(ids), np.arange(1_006_400))



def _heavy_beside_light(tmp_path: Path) -> pqloader.ParquetDataset:
    """Labels in one folder, 4 KiB texts in another: the mean row is ~70 bytes."""
    light = pa.table({"id": np.arange(400_000), "text": pa.array([""] * 400_000)})
    pqloader.write_dataset(light, tmp_path / "light", row_group_size=65_536)
    heavy = pa.table({"id": np.arange(400_000, 406_000),
                      "text": pa.array([f"{i:08d}" + "y" * 4_088 for i in range(6_000)])})
    pqloader.write_dataset(heavy, tmp_path / "heavy", row_group_size=500, compression="zstd")
    return pqloader.ParquetDataset([tmp_path / "light", tmp_path / "heavy"])


def test_a_budget_its_padded_batches_pass_is_warned_of(tmp_path: Path) -> None:
    """Token lists of 1 beside a few of 2,000: nearly every shuffled batch of 8,192 rows pads
    to 2,000, 62 MiB a batch, which no window size can help; the loader passed its budget
    silently."""
    short = pa.ListArray.from_arrays(np.arange(400_001, dtype=np.int32),
                                     np.ones(400_000, np.int32))
    pqloader.write_dataset(pa.table({"id": np.arange(400_000), "tokens": short}),
                           tmp_path / "short", row_group_size=50_000)
    long = pa.ListArray.from_arrays(np.arange(0, 2_000 * 200 + 1, 2_000, dtype=np.int32),
                                    np.ones(2_000 * 200, np.int32))
    pqloader.write_dataset(pa.table({"id": np.arange(400_000, 400_200), "tokens": long}),
                           tmp_path / "long", row_group_size=25)
    ds = pqloader.ParquetDataset([tmp_path / "short", tmp_path / "long"])
    loader = pqloader.DataLoader(ds, batch_size=8192, shuffle=True, num_workers=0,
                                 memory_budget_bytes=80 * MIB)
    held: collections.deque[Any] = collections.deque(maxlen=3)  # the last three held: the
    rows = 0  # RSS is looked at every so often, and a batch let go at once could fall between
    with pytest.warns(RuntimeWarning, match="memory_budget_bytes=83,886,080"):
        for batch in loader:
            rows += len(batch["id"])
            held.append(batch)
    assert rows == 400_200


def test_a_read_ahead_waits_for_its_own_row_groups_bytes(tmp_path: Path) -> None:
    """Each window's read is counted by its row groups, not the mean row (20x less here)."""
    from pqloader._plan import Segment, Window
    from pqloader._slices import Slice

    ds = _heavy_beside_light(tmp_path)
    d = ds._discovery
    stages = pqloader.DataLoader(ds, batch_size=64, num_workers=0,
                                 memory_budget_bytes=64 * MIB)._planner.stages
    heavy = int(np.argmax(d.byte_size / d.num_rows))
    n = int(d.num_rows[heavy])
    whole = Segment(Window((Slice(heavy, 0, n),), key=(0,)), 0, n)
    assert stages.need_bytes(whole) == 2 * int(d.held()[heavy])  # decoded, then permuted
    half = Segment(Window((Slice(heavy, 0, n // 2),), key=(0,)), 0, n // 2)
    assert stages.need_bytes(half) == int(d.held()[heavy]) + int(d.byte_size[heavy]) // 2


def test_a_budget_passed_is_warned_of_once_in_the_callers_thread() -> None:
    """Warned where it was seen (a worker thread), a warning filtered into an error killed
    the thread, and the caller never heard of it (found in review)."""
    from pqloader._memory import MemoryBudget

    budget = MemoryBudget(8 * MIB)
    budget.start()
    held = mmap.mmap(-1, 96 * MIB)  # fresh pages, not a heap's freed ones
    held.write(b"x" * (96 * MIB))  # touched: resident
    seen = threading.Thread(target=budget.used)  # a worker thread sees it; says nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seen.start()
        seen.join()
    with pytest.raises(RuntimeWarning, match=r"x memory_budget_bytes=8,388,608"), \
            warnings.catch_warnings():
        warnings.simplefilter("error")
        budget.warn_if_over()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        budget.used()
        budget.warn_if_over()  # once
    held.close()


def test_memory_freed_before_the_iteration_is_no_room_for_the_loader() -> None:
    """glibc's heap keeps pages freed before an iteration (the suite's earlier tests in CI):
    counted in the RSS the budget starts from, they were reused unseen, and a loader past its
    budget went unwarned (a CI failure). They go back to the system as the budget starts."""
    from pqloader._memory import MemoryBudget

    blocks = [np.ones(2**13) for _ in range(3_200)]  # 200 MiB in blocks the heap serves
    kept = blocks[::2]  # the heap cannot shrink past them: every other block freed stays
    del blocks
    budget = MemoryBudget(64 * MIB)
    budget.start()
    again = [np.ones(2**13) for _ in range(1_600)]  # 100 MiB, in the blocks freed
    assert budget.used() >= 80 * MIB, "reused pages hid what the loader added"
    del again, kept


def test_an_unshuffled_remote_epoch_stays_in_the_budget(
        http_server: Callable[[Path], str], tmp_path: Path) -> None:
    """Unshuffled remote reads went 8 row groups ahead: all 8 were admitted at once, each
    seeing the same room, and a 100 MiB budget held 123-154 MiB (found in review). They are
    read in windows now, as shuffled ones are."""
    budget = 100 * MIB  # against 192 MB of data
    rng = np.random.default_rng(0)
    (tmp_path / "d").mkdir()
    for f in range(3):  # row groups of 8 MB
        table = pa.table({"id": np.arange(f * 4_000_000, (f + 1) * 4_000_000),
                          "x": rng.random(4_000_000)})
        pq.write_table(table, tmp_path / "d" / f"part-{f}.parquet", row_group_size=500_000,
                       compression="none")
    ds = pqloader.ParquetDataset(http_server(tmp_path / "d") + "/")
    loader = pqloader.DataLoader(ds, batch_size=65_536, num_workers=0,
                                 memory_budget_bytes=budget)
    seen = np.ones(12_000_000, dtype=np.int8)  # written now: in the RSS before the epoch

    def count() -> Iterator[dict[str, torch.Tensor]]:  # (keeping 12M ids took 96 MB)
        for batch in loader:
            np.subtract.at(seen, batch["id"].numpy(), 1)
            yield {"id": batch["id"][:0]}

    added, _ = _peak_added(count())
    assert added <= budget, f"added {added / MIB:.0f} MiB over a {budget / MIB:.0f} MiB budget"
    assert not seen.any()  # every row once


_DECODED_AT_ONCE = '''
import sys
import pyarrow as pa, pyarrow.compute as pc
import pqloader
from pqloader._read import FragmentReader
ds = pqloader.ParquetDataset(sys.argv[1], filter=pc.field("x") < 0.01)
d = ds._discovery
before = pa.default_memory_pool().max_memory()
tables = FragmentReader(d).read_many(list(range(len(d.file_index))))
print(sum(t.num_rows for t in tables), pa.default_memory_pool().max_memory() - before)
'''


def test_small_row_groups_a_filter_thins_are_not_decoded_all_at_once(tmp_path: Path) -> None:
    """A filter that keeps few rows made a window span a whole file, whose small row groups
    were decoded in one call before the filter: 3.3-3.9x a 64 MiB budget (found in review)."""
    import subprocess
    import sys

    rng = np.random.default_rng(0)
    rows = 40 * 65_536  # 40 row groups of ~0.75 MiB decoded: "small", read together
    x = rng.random(rows, dtype=np.float32)
    pqloader.write_dataset(pa.table({"id": np.arange(rows), "x": x}), tmp_path / "ds",
                           row_group_size=65_536, compression="none")
    done = subprocess.run([sys.executable, "-c", _DECODED_AT_ONCE, str(tmp_path / "ds")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    kept, peak = map(int, done.stdout.split())
    assert kept == int((x < 0.01).sum())
    assert peak < 8 << 20, f"{peak:,} bytes decoded at once (a file's row groups: ~16 MiB)"


def test_a_batch_held_beside_what_its_transform_made_is_warned_of(tmp_path: Path) -> None:
    """The RSS was looked at after a batch was made, its transform's input already freed: a
    16,384-row padded batch cloned by its transform passed the budget 1.37x, unwarned (found
    by fuzzing). Here the batch (96 MiB) is freed as the transform's small result replaces
    it: only a look while both are held sees it."""
    pqloader.write_dataset(pa.table({"x": np.arange(20_000, dtype=np.float32)}),
                           tmp_path / "ds", rows_per_file=5_000, row_group_size=1_000)
    budget = 64 << 20

    def collate(batch: pa.RecordBatch) -> torch.Tensor:
        return torch.ones((3 * budget // 2) // 4)  # 1.5x the budget, its pages touched

    loader = pqloader.DataLoader(pqloader.ParquetDataset(tmp_path / "ds"), batch_size=4096,
                                 num_workers=0, memory_budget_bytes=budget,
                                 collate_fn=collate, transform=lambda big: big[:1].clone())
    with pytest.warns(RuntimeWarning, match=r"memory_budget_bytes"):
        assert len(list(loader)) == 5
