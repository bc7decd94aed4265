"""The autotune benchmark runs end to end in its tiny size and prints a parsable RESULT line."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.slow
def test_bench_autotune_tiny(run_bench: Any) -> None:
    pytest.importorskip("psutil")
    pytest.importorskip("simplejpeg")
    result: Any = run_bench("bench_autotune")
    assert result["benchmark"] == "autotune"
    for workload in ("w1", "w2", "w3"):
        summary = result[workload]
        assert set(summary) == {"floor", "w0", "auto"}
        for setting, s in summary.items():
            assert not s["errors"], (workload, setting, s["errors"])
            assert s["rate"] > 0 and s["first_epoch"] > 0
        auto = summary["auto"]
        assert auto["x_best"] > 0 and auto["best_hand"] == "w0" and auto["x_floor"] > 0
        assert all(t is None or 0 <= t <= 8 for t in auto["threads"])  # None: not settled
