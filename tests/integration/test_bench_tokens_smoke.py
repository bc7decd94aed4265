"""The token-list benchmark runs end to end in its tiny size and prints a parsable RESULT line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_tokens.py"
METHODS = {"floor", "naive-w0", "naive-w2", "pqloader-w0", "pqloader-w2"}
WHOLE_EPOCH = {"floor", "pqloader-w0", "pqloader-w2"}


@pytest.mark.slow
def test_bench_tokens_tiny(tmp_path: Path) -> None:
    pytest.importorskip("pandas")
    pytest.importorskip("psutil")
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--tiny", "--data", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout
    result = json.loads(lines[0].removeprefix("RESULT "))
    assert result["benchmark"] == "tokens"
    assert set(result["methods"]) == METHODS
    for method, summary in result["methods"].items():
        assert not summary["errors"], (method, summary["errors"])
        assert summary["tokens_per_s"] > 0, method
        assert summary["peak_rss_mib"] > 0, method
        assert 0 < summary["fill"] <= 1, method
    total = result["total_tokens"]
    assert total >= 32 * result["rows"]
    runs = [run for m in WHOLE_EPOCH for run in result["methods"][m]["runs"]]
    assert {run["tokens"] for run in runs} == {total}
    assert len({run["token_sum"] for run in runs}) == 1  # the same tokens, padding excluded
    for method in METHODS - WHOLE_EPOCH:
        for run in result["methods"][method]["runs"]:
            assert run["batches"] == result["naive_batches"]
            assert 0 < run["tokens"] <= 512 * result["batch_size"] * run["batches"]
