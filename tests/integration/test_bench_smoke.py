"""The tabular benchmark runs end to end in its tiny size and prints a parsable RESULT line."""

from __future__ import annotations

from typing import Any

import pytest

METHODS = {"floor", "naive-w0", "naive-w2", "pqloader-w0", "pqloader-w2", "pqloader-auto",
           "pqloader-w2-proc"}


@pytest.mark.slow
def test_bench_tabular_tiny(run_bench: Any) -> None:
    pytest.importorskip("pandas")
    pytest.importorskip("psutil")
    result: Any = run_bench("bench_tabular")
    assert set(result["methods"]) == METHODS
    for method, summary in result["methods"].items():
        assert not summary["errors"], (method, summary["errors"])
        assert summary["rows_per_s"] > 0, method
        assert summary["peak_rss_mib"] > 0, method
    for method in METHODS - {"naive-w0", "naive-w2"}:
        assert all(run["rows"] == result["rows"] for run in result["methods"][method]["runs"])
