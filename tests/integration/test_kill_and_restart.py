"""Kill -9 mid-epoch, restart: examples/train_with_checkpoints.py continues exactly.

The example runs as a real subprocess. It is frozen (SIGSTOP) at a moment when its delivered
log is past a checkpoint and mid-interval, killed with SIGKILL, and started again with the same
arguments. Its delivered log then shows: the batches after the checkpoint's step were trained
on twice, identically; the restart began with the batch right after the checkpoint; and,
leaving out the killed run's batches after the checkpoint, every id came exactly once, in the
order of an uninterrupted epoch.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

import pqloader

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_with_checkpoints.py"
ROWS = 20_000
BATCH = 256
EVERY = 10  # steps between checkpoints
NUM_BATCHES = math.ceil(ROWS / BATCH)  # 79: one epoch
KILL_AFTER = 25  # batches logged before the kill may happen: past two checkpoints
SLEEP_S = 0.03  # per step: an epoch takes >= 2.4 s, time enough to catch it mid-epoch
DEADLINE_S = 180.0  # generous: only a hung child gets near it

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL/SIGSTOP are POSIX")


def _read_log(path: Path) -> list[dict[str, Any]]:
    """The log's complete lines (a line being written has no newline yet)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    return [json.loads(line) for line in data[: data.rfind(b"\n") + 1].splitlines()]


def _runs(records: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(start event, batch records) per run, in order."""
    runs: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    for r in records:
        if r.get("event") == "start":
            runs.append((r, []))
        else:
            assert runs, f"a batch logged before any start event: {r}"
            runs[-1][1].append(r)
    return runs


def _checkpoint(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    ckpt: dict[str, Any] = torch.load(path, weights_only=True)
    return ckpt


def _wait_stopped(pid: int, deadline: float) -> None:
    process = psutil.Process(pid)
    while process.status() != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline, f"child {pid} did not stop on SIGSTOP"
        time.sleep(0.005)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child and whatever it started (its session), then reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


def _start(args: list[str], out: Path) -> subprocess.Popen[bytes]:
    with open(out, "ab") as f:
        # Output to a file, never a pipe nobody reads; a session of its own, so that its
        # worker processes can be killed with it.
        return subprocess.Popen([sys.executable, str(EXAMPLE), *args], stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _reference_ids(data: Path) -> list[list[int]]:
    """The batches of an uninterrupted epoch 0 with the example's loader settings."""
    loader = pqloader.DataLoader(pqloader.ParquetDataset(data), batch_size=BATCH, shuffle=True,
                                 seed=0, num_workers=2)
    loader.set_epoch(0)
    return [batch["id"].tolist() for batch in loader]


@pytest.mark.slow
@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_sigkill_mid_epoch_then_restart_continues_exactly(tmp_path: Path,
                                                          worker_type: str) -> None:
    data, ckpt_path = tmp_path / "data", tmp_path / "ckpt.pt"
    log_path, out = tmp_path / "delivered.jsonl", tmp_path / "output.txt"
    args = ["--data", str(data), "--rows", str(ROWS), "--batch-size", str(BATCH),
            "--epochs", "1", "--checkpoint-every", str(EVERY), "--checkpoint", str(ckpt_path),
            "--delivered-log", str(log_path), "--sleep-per-step", str(SLEEP_S),
            "--num-workers", "2", "--worker-type", worker_type,
            "--audit-dir", str(tmp_path / "audit")]
    deadline = time.monotonic() + DEADLINE_S

    def output() -> str:
        return out.read_text(errors="replace") if out.exists() else ""

    # -- the first run, killed mid-epoch past a checkpoint -------------------------------------
    proc = _start(args, out)
    try:
        while True:
            assert proc.poll() is None, (
                f"the first run ended (rc {proc.returncode}) before it could be killed:\n"
                f"{output()}")
            assert time.monotonic() < deadline, f"no progress to kill at:\n{output()}"
            runs = _runs(_read_log(log_path))
            if runs and len(runs[0][1]) >= KILL_AFTER:
                # Freeze it and look: kill only if batches were logged after the checkpoint
                # on disk, else let it go on a little and look again.
                os.kill(proc.pid, signal.SIGSTOP)
                _wait_stopped(proc.pid, deadline)
                killed_at = _runs(_read_log(log_path))[0][1][-1]["step"]
                ckpt = _checkpoint(ckpt_path)
                if ckpt is not None and ckpt["step"] < killed_at < NUM_BATCHES:
                    os.kill(proc.pid, signal.SIGKILL)
                    break
                os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.01)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        _kill_group(proc)  # also torch's worker processes, orphaned by the kill

    ckpt = _checkpoint(ckpt_path)
    assert ckpt is not None
    saved_step = int(ckpt["step"])
    assert saved_step >= EVERY and saved_step % EVERY == 0, saved_step
    assert ckpt["loader"]["epoch"] == 0 and ckpt["loader"]["batches"] == saved_step

    # -- the restart, with the same arguments, to the end of the epoch ----------------------
    proc = _start(args, out)
    try:
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        _kill_group(proc)
    assert rc == 0, f"the restarted run failed (rc {rc}):\n{output()}"
    assert f"resumed from {ckpt_path}: step {saved_step}" in output(), output()

    # -- what the delivered log shows -------------------------------------------------------
    runs = _runs(_read_log(log_path))
    assert len(runs) == 2, f"{len(runs)} runs in the log:\n{output()}"
    (start1, first), (start2, second) = runs
    assert start1["step"] == 0 and start2["step"] == saved_step
    assert [r["step"] for r in first] == list(range(1, killed_at + 1))
    assert [r["step"] for r in second] == list(range(saved_step + 1, NUM_BATCHES + 1))
    assert all(r["epoch"] == 0 and r["batch"] == r["step"] for r in first + second)

    # the batches after the checkpoint came twice: before the kill, and again, identical
    redelivered = [r for r in first if r["step"] > saved_step]
    assert redelivered, "nothing was logged after the checkpoint: the kill proved nothing"
    assert second[: len(redelivered)] == redelivered
    # the restart began with the batch right after the checkpoint
    assert second[0]["step"] == saved_step + 1 == redelivered[0]["step"]

    # leaving out the killed run's batches after the checkpoint: every id exactly once ...
    kept = [r["ids"] for r in first if r["step"] <= saved_step] + [r["ids"] for r in second]
    counts = collections.Counter(i for ids in kept for i in ids)
    assert sorted(counts) == list(range(ROWS)), "ids missing or foreign"
    assert max(counts.values()) == 1, [i for i, c in counts.items() if c > 1][:10]
    # ... in the very order of an uninterrupted epoch (the cursor resumed, batch for batch)
    assert kept == _reference_ids(data)

    # pqloader's own audit says the same: the killed run's batches after the checkpoint came
    # twice (it may have yielded one more than it logged), every other row exactly once
    records = [[json.loads(line) for line in p.read_text().splitlines()[1:]]
               for p in (tmp_path / "audit").glob("rank*.jsonl")]
    (killed_record,) = [r for r in records if r[0]["batch"] == 0]  # the restart began later
    yielded = len(killed_record)
    assert yielded in (killed_at, killed_at + 1)
    (report,) = pqloader.audit(tmp_path / "audit")
    assert report.missing == 0
    assert report.duplicates == (yielded - saved_step) * BATCH

    # the final checkpoint closes the epoch
    final = _checkpoint(ckpt_path)
    assert final is not None and final["step"] == NUM_BATCHES
    assert (final["loader"]["epoch"], final["loader"]["batches"]) == (0, NUM_BATCHES)
