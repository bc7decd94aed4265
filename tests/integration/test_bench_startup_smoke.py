"""The start-up benchmark runs end to end in its tiny size and prints a parsable RESULT line."""

from __future__ import annotations

from typing import Any

import pytest

METHODS = {"floor", "manifest-w0", "manifest-w2", "footers-w0", "footers-w2"}


@pytest.mark.slow
def test_bench_startup_tiny(run_bench: Any) -> None:
    pytest.importorskip("psutil")
    result: Any = run_bench("bench_startup")
    assert result["benchmark"] == "startup"
    assert set(result["methods"]) == METHODS
    for method, summary in result["methods"].items():
        assert not summary["errors"], (method, summary["errors"])
        assert summary["seconds"] > 0, method
        assert summary["import_s"] > 0, method
        assert summary["peak_rss_mib"] > 0, method
        for run in summary["runs"]:
            assert run["batch_rows"] == result["batch_size"], method
            assert run["seconds"] >= run["open_s"] + run["first_batch_s"], method
    for kind, target in (("manifest", 0.5), ("footers", 2.0)):
        for workers in (0, 2):
            assert result["methods"][f"{kind}-w{workers}"]["target_s"] == target
