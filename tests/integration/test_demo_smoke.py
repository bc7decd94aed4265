"""The demo (examples/demo.py) runs end to end on a small dataset and reports what it measures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.py"


def test_demo_runs_and_reports_throughput_and_waiting_share() -> None:
    result = subprocess.run(
        [sys.executable, str(DEMO), "--rows", "50000", "--files", "4"],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, f"demo failed:\n{result.stdout}\n{result.stderr}"
    out = result.stdout
    assert "rows/s" in out, out
    assert "waiting for data" in out, out
    assert "ParquetDataset(50,000 rows, 4 files" in out, out
    assert "done in" in out, out
