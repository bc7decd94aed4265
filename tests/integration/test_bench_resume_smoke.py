"""The resume benchmark runs end to end in its tiny size, checks its batches and prints RESULT."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_resume.py"


@pytest.mark.slow
def test_bench_resume_tiny(tmp_path: Path) -> None:
    pytest.importorskip("psutil")  # bench_resume reuses bench_tabular's data, which imports it
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--tiny", "--data", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout
    result = json.loads(lines[0].removeprefix("RESULT "))
    assert result["benchmark"] == "resume"
    cells = {(r["position"], r["workers"]) for r in result["results"]}
    assert cells == {(p, n) for p in (0.0, 0.01, 0.5, 0.99) for n in (0, 2)}
    for r in result["results"]:
        assert not r["errors"], r["errors"]
        assert 0 <= r["batch"] < result["num_batches"]
        for kind in ("restore", "replay"):
            assert len(r[kind]["runs"]) == result["repeats"] == 1
            assert r[kind]["seconds"] > 0
        assert all(run["matches_reference"] for run in r["restore"]["runs"])
        digests = {run["digest"] for kind in ("restore", "replay") for run in r[kind]["runs"]}
        assert len(digests) == 1, r  # both ways delivered the same batch
    batches = {r["position"]: r["batch"] for r in result["results"]}
    assert batches[0.0] == 0 < batches[0.01] < batches[0.5] < batches[0.99]
