"""Shared fixtures: datasets made on the fly in temporary folders."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import pqloader

MakeDataset = Callable[..., Path]


@pytest.fixture
def make_dataset(tmp_path: Path) -> MakeDataset:
    """Write a dataset with an ``id`` column 0..rows-1 and a few typed columns; return its path."""
    count = 0

    def make(rows: int = 1000, *, rows_per_file: int = 300, row_group_size: int = 100,
             name: str | None = None, extra: bool = True) -> Path:
        nonlocal count
        count += 1
        path = tmp_path / (name or f"ds{count}")
        rng = np.random.default_rng(rows)
        columns: dict[str, object] = {"id": np.arange(rows, dtype=np.int64)}
        if extra:
            columns["x"] = rng.random(rows, dtype=np.float32)
            columns["tokens"] = pa.array(
                [list(range(i % 5)) for i in range(rows)], pa.list_(pa.int32())
            )
            columns["text"] = [f"row {i}" for i in range(rows)]
        pqloader.write_dataset(pa.table(columns), path, rows_per_file=rows_per_file,
                               row_group_size=row_group_size)
        return path

    return make


@pytest.fixture
def run_bench(tmp_path: Path) -> Callable[[str], dict[str, object]]:
    """Run ``benchmarks/NAME.py --tiny`` in a child process; return its ``RESULT`` JSON."""

    def run(name: str) -> dict[str, object]:
        script = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
        proc = subprocess.run(
            [sys.executable, str(script), "--tiny", "--data", str(tmp_path / "data")],
            capture_output=True, text=True, timeout=600,
        )
        assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert len(lines) == 1, proc.stdout
        result: dict[str, object] = json.loads(lines[0].removeprefix("RESULT "))
        return result

    return run
