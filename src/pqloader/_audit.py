"""Sample audit: a record of the rows each rank delivered, and the check of an epoch's coverage.

Opt in with ``DataLoader(..., audit_dir=DIR)``. Every process appends one JSON line per batch it
yields, flushed at once, to a file of its own (``DIR/rank00000-<pid>-<id>.jsonl``): a killed
run leaves every batch it delivered on record, and its restart writes a new file. Rows are
global row numbers (the dataset's files and row groups in order), stored as runs of consecutive
numbers, zlib-compressed: a contiguous batch costs two numbers.

:func:`audit` merges every file of a folder and says, per epoch, which rows came more than once
(and in which batches), which never came, and how the batches spread over ranks and workers.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import uuid
import warnings
import weakref
import zlib
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ._errors import InvalidArgumentError
from ._plan import num_batches

HEADER = "pqloader.audit"


def encode_rows(rows: np.ndarray) -> str:
    """Row numbers as runs (start, length), delta- and zlib-coded, in base64."""
    ids = np.sort(np.asarray(rows, dtype=np.int64))
    if len(ids) == 0:
        return ""
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = ids[np.concatenate([[0], breaks])]
    lengths = np.diff(np.concatenate([[0], breaks, [len(ids)]]))
    runs = np.stack([np.diff(starts, prepend=0), lengths], axis=1).astype("<i8")
    return base64.b64encode(zlib.compress(runs.tobytes(), 6)).decode()


def decode_rows(text: str) -> np.ndarray:
    if not text:
        return np.zeros(0, dtype=np.int64)
    runs = np.frombuffer(zlib.decompress(base64.b64decode(text)), dtype="<i8").reshape(-1, 2)
    starts, lengths = np.cumsum(runs[:, 0]), runs[:, 1]
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    rows: np.ndarray = np.arange(int(lengths.sum()), dtype=np.int64) + offsets
    return rows


class AuditLog:
    """One process's append-only record of delivered batches."""

    def __init__(self, directory: str | os.PathLike[str], *, rank: int, world_size: int,
                 num_workers: int, dataset: Mapping[str, Any], batch_size: int,
                 drop_last: bool) -> None:
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / f"rank{rank:05d}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
        self.rank, self.world_size, self.num_workers = rank, world_size, num_workers
        self.warned = False  # of a batch whose rows a transform changed
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        weakref.finalize(self, self._file.close)  # or with the loader (a ResourceWarning)
        self._write({"format": HEADER, "version": 1, "rank": rank, "world_size": world_size,
                     "num_workers": num_workers, "dataset": dict(dataset),
                     "batch_size": batch_size, "drop_last": drop_last})

    def _write(self, record: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()

    def record(self, epoch: int, batch: int, rows: np.ndarray, plan: str, *,
               made: Any = None) -> None:
        """Batch ``batch`` of ``epoch`` held ``rows`` (called as it is handed to the caller);
        ``plan`` names the epoch's plan as every rank of a run names it (:func:`plan_name`);
        ``made``: the batch as the caller gets it. The rows read are recorded: those a
        transform or collate_fn left out or repeated passed for delivered once (found in
        review), so a batch whose rows they changed is recorded so, warned of once, and
        reported unchecked."""
        record = {"epoch": epoch, "batch": batch, "worker": batch % max(1, self.num_workers),
                  "rows": encode_rows(rows), "plan": plan}
        n = batch_rows(made)
        if n != len(rows):
            record["rows_out"] = n
            if not self.warned:
                self.warned = True
                said = f"with {n:,}" if n is not None else \
                    f"as a {type(made).__name__} whose rows the audit cannot count"
                warnings.warn(
                    f"audit_dir: a batch of {len(rows):,} rows left transform/collate_fn "
                    f"{said}: the audit records the rows read for each batch, not those a "
                    "transform keeps, repeats or packs; it reports such batches as unchecked",
                    RuntimeWarning, stacklevel=3)
        self._write(record)


def batch_rows(batch: Any) -> int | None:
    """The rows a batch holds, where its values agree on it (their first dimension, in dicts,
    tuples and lists of them, nested); an Arrow batch's rows; a list of rows as dicts. Else
    ``None``: a structure the audit cannot count (only flat dicts, tuples and lists were
    counted, and any other batch passed for unchanged: rows a transform returning a bare
    tensor or a nested dict dropped were reported delivered, found by fuzzing)."""
    if isinstance(batch, list) and batch and all(isinstance(r, Mapping) for r in batch):
        return len(batch)  # rows as dicts (RecordBatch.to_pylist(), what torch collates)
    sizes: set[int] = set()

    def count(value: Any, top: bool) -> None:
        if isinstance(value, (pa.RecordBatch, pa.Table, pa.Array, pa.ChunkedArray)):
            sizes.add(len(value))
        elif hasattr(value, "shape"):
            if len(value.shape):  # (a scalar counts no rows)
                sizes.add(int(value.shape[0]))
        elif isinstance(value, Mapping):
            for v in value.values():
                count(v, False)
        elif isinstance(value, tuple) or (top and isinstance(value, list)):
            for v in value:
                count(v, False)
        elif isinstance(value, list):  # a column of values (texts, bytes)
            sizes.add(len(value))

    count(batch, True)
    return sizes.pop() if len(sizes) == 1 else None


def plan_name(origin: Mapping[str, Any] | None, world_size: int, batch_size: int,
              drop_last: bool) -> str:
    """The padding a plan may add, and which plan it is: ``whole:`` (an epoch dealt from its
    start, padded to even ``world_size`` ranks), ``own:`` (each rank dealt its own rows left:
    no new padding), ``dealt:`` (the rows left dealt to a new world, padded again). Ranks
    resumed exactly name the plan they resumed: its padding counts once, however many runs
    delivered it (it counted once per record file's run: a restart's real repeats passed for
    padding, found in review)."""
    kind = "whole" if origin is None else "own" if origin.get("own") else "dealt"
    text = json.dumps([world_size, batch_size, drop_last, origin], sort_keys=True)
    return f"{kind}:{hashlib.sha1(text.encode()).hexdigest()[:12]}"


def _allowed(name: str, num_rows: int, world_size: int, drop_last: bool) -> int:
    """Deliveries past one that the plan ``name`` pads with."""
    kind = name.partition(":")[0]
    if drop_last or kind == "own":
        return 0
    return -num_rows % world_size if kind == "whole" else world_size - 1

    def close(self) -> None:
        self._file.close()


@dataclass
class EpochReport:
    """The coverage of one epoch, over every record file."""

    epoch: int
    num_rows: int
    delivered: int = 0  # row deliveries, repeats included
    duplicates: int = 0  # rows delivered more than once
    missing: int = 0  # rows never delivered
    padding: int = 0  # deliveries past one that even the ranks' batches (not duplicates)
    dropped: int = 0  # rows drop_last left out (not missing)
    reshaped: int = 0  # batches a transform or collate_fn gave other rows than read: unchecked
    duplicate_examples: list[dict[str, Any]] = field(default_factory=list)
    batches_per_rank: dict[int, int] = field(default_factory=dict)
    batches_per_worker: dict[str, int] = field(default_factory=dict)  # "rank/worker"

    @property
    def exactly_once(self) -> bool:
        return self.duplicates == 0 and self.missing == 0 and self.reshaped == 0


def _read_records(path: Path) -> list[dict[str, Any]] | None:
    """A record file's lines, parsed (``None``: a file cut short before its header).

    A process killed mid-write, or a full disk, leaves its last line cut short: that batch was
    never acknowledged as recorded, so the line is skipped with a warning. A bad line anywhere
    else is damage the log cannot explain, and an error.
    """
    with open(path, encoding="utf-8", errors="replace") as f:  # garbage fails as JSON below
        numbered = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    if not numbered:  # killed between making the file and writing its header (or a full disk)
        warnings.warn(f"{path}: empty (a process killed as it started?); skipped",
                      stacklevel=3)
        return None
    records: list[dict[str, Any]] = []
    for n, line in numbered:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if n != numbered[-1][0]:
                raise InvalidArgumentError(
                    f"{path}: line {n} is not a JSON record ({exc.msg}); the file is damaged: "
                    "move it out of the folder to audit the others") from exc
            held = "the batch it held was never recorded" if records else "the file holds no batch"
            warnings.warn(f"{path}: line {n} is cut short (a process killed while writing it?); "
                          f"skipped: {held}", stacklevel=3)
            if not records:
                return None
    return records


def _left_out(num_rows: int, head: Mapping[str, Any]) -> int | None:
    """Rows an epoch of the run that wrote ``head`` leaves out by ``drop_last`` (``None``: a
    record of before this was written down)."""
    if "drop_last" not in head:
        return None
    if not head["drop_last"]:
        return 0
    world_size, batch_size = int(head["world_size"]), int(head["batch_size"])
    per_rank = num_batches(np.array([num_rows]), batch_size=batch_size, world_size=world_size,
                           drop_last=True)
    return num_rows - world_size * per_rank * batch_size


def audit(directory: str | os.PathLike[str], *, max_examples: int = 5) -> list[EpochReport]:
    """Check, per epoch, that the recorded deliveries cover every row exactly once.

    Counted apart, as the loader documents them: the padding that evens the ranks (at most
    ``world_size - 1`` rows twice, without ``drop_last``, for each run of the epoch: its ranks
    write ``world_size`` record files), and the rows ``drop_last`` leaves out (as many as
    every record file's settings leave out, none delivered twice).
    """
    files = sorted(Path(directory).glob("rank*.jsonl"))
    if not files:
        raise InvalidArgumentError(f"{directory}: no audit records (rank*.jsonl) found")
    num_rows = None
    dataset: dict[str, Any] = {}
    first = Path()
    counts: dict[int, np.ndarray] = {}
    where: dict[int, list[tuple[str, int, int, np.ndarray]]] = defaultdict(list)
    reports: dict[int, EpochReport] = {}
    # per epoch: the record files of each world size it ran in (a run's ranks write one each;
    # records before plans were named), and the plans named
    worlds: dict[int, defaultdict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    plans: dict[int, set[tuple[str, int, bool]]] = defaultdict(set)
    left_out: dict[int, set[int | None]] = defaultdict(set)  # per epoch, per record file
    for path in files:
        lines = _read_records(path)
        if lines is None:
            continue
        if not lines or lines[0].get("format") != HEADER:
            raise InvalidArgumentError(f"{path}: not a pqloader audit record")
        try:  # valid JSON that is no record: damage, told as such
            head = lines[0]
            if num_rows is None:
                num_rows, dataset, first = int(head["dataset"]["rows"]), head["dataset"], path
            elif head["dataset"] != dataset:  # rows alone: two datasets of one size were merged
                raise InvalidArgumentError(
                    f"{path}: records of another dataset than {first.name}'s in the same folder "
                    f"({head['dataset']} against {dataset}); audit each run's folder alone")
            for rec in lines[1:]:
                epoch = int(rec["epoch"])
                left_out[epoch].add(_left_out(num_rows, head))
                if "plan" in rec:
                    plans[epoch].add((str(rec["plan"]), int(head["world_size"]),
                                      bool(head["drop_last"])))
                else:
                    worlds[epoch][int(head.get("world_size", 1))].add(path.name)
                rows = decode_rows(rec["rows"])
                count = counts.setdefault(epoch, np.zeros(num_rows, dtype=np.int32))
                np.add.at(count, rows, 1)
                report = reports.setdefault(epoch, EpochReport(epoch, num_rows))
                report.delivered += len(rows)
                report.reshaped += "rows_out" in rec
                rank = int(head["rank"])
                report.batches_per_rank[rank] = report.batches_per_rank.get(rank, 0) + 1
                key = f"{rank}/{rec['worker']}"
                report.batches_per_worker[key] = report.batches_per_worker.get(key, 0) + 1
                where[epoch].append((path.name, rank, int(rec["batch"]), rows))
        except InvalidArgumentError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, zlib.error) as exc:
            raise InvalidArgumentError(
                f"{path}: a record lacks or garbles its {exc}; the file is damaged: move it "
                "out of the folder to audit the others") from exc
    for epoch, report in reports.items():
        count = counts[epoch]
        report.duplicates = int((count > 1).sum())
        report.missing = int((count == 0).sum())
        extra = report.delivered - report.num_rows
        # each plan the epoch ran pads as it does (once, whatever runs delivered it); records
        # of before: each run in a world of w ranks (w record files) evens its rows anew, a
        # world size it came back to counting again (2 -> 3 -> 2: 1 + 2 + 1 rows)
        named = sum(_allowed(name, report.num_rows, ranks, dropping)
                    for name, ranks, dropping in plans[epoch])
        padding = named + sum(-(-len(names) // w) * (w - 1) for w, names in worlds[epoch].items())
        if not report.missing and extra <= padding:
            # without drop_last, the ranks yield equal batches: at most world_size - 1 rows
            # come again when the rows do not divide evenly, and none is missing then; an
            # epoch resumed in another world evens the rows left again, for its world_size - 1
            # (a row may come 3 times: 1 row left for 3 ranks)
            report.padding, report.duplicates = extra, 0
        (dropped,) = left_out[epoch] if len(left_out[epoch]) == 1 else (None,)
        if dropped and report.missing == dropped and not report.duplicates:
            # resumed with other settings (or records of before): which is unknown, so missing
            report.dropped, report.missing = report.missing, 0
        if report.duplicates:
            dup = count > 1
            for name, rank, batch, rows in where[epoch]:
                if len(report.duplicate_examples) >= max_examples:
                    break
                hit = rows[dup[rows]]
                if len(hit):
                    report.duplicate_examples.append(
                        {"file": name, "rank": rank, "batch": batch, "rows": hit[:5].tolist()})
    return [reports[e] for e in sorted(reports)]
